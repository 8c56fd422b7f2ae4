"""The SDK type-checks from an installed wheel, and its results are typed (STYLE P13).

The wheel is built from a copy of the sources and installed with ``--no-deps`` into a
throwaway environment whose dependencies come from this venv (nothing downloads); mypy
then checks a snippet that uses the SDK as the README shows it and reveals the type of
every result. A result typed ``Any`` would let a user's type checker accept anything.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("uprof", "domain", "projections", "policies", "audit", "migrations", "benchmarks")

SNIPPET = """
from uprof import Client
from uprof.sdk import AsyncClient, ProfileSlice

client = Client("http://127.0.0.1:8765", "upk_0000000000000000_x")
reveal_type(client)
reveal_type(client.capture("alice", agent_id="agent:one", user_input="I live in Lisbon"))
reveal_type(client.capture_many("alice", []))
reveal_type(client.submit_proposals("alice", [], agent_id="agent:one"))
reveal_type(client.grant_consent("alice", categories=["*"], purposes=["p"], collected_by="form:1"))
reveal_type(client.withdraw_consent("alice", "c1"))
reveal_type(client.erase_subject("alice"))
reveal_type(client.erase_item("alice", "i1"))
reveal_type(client.erase_capture("alice", "c1"))
reveal_type(client.export_subject("alice"))
reveal_type(client.audit_export())
reveal_type(client.audit_verify("{}"))
reveal_type(client.audit_key())
reveal_type(client.slice("alice", "diet", budget_tokens=200, purpose="p", agent_id="a"))
reveal_type(client.profile("alice"))
reveal_type(client.evidence("alice", "i1"))
reveal_type(client.consents("alice"))
reveal_type(client.whoami())
piece: ProfileSlice = client.slice("alice", "q", budget_tokens=1, purpose="p", agent_id="a")
reveal_type(piece.items[0].text)
reveal_type(client.erase_subject("alice").receipt)


async def use_async(remote: AsyncClient) -> None:
    reveal_type(await remote.slice("alice", "q", budget_tokens=1, purpose="p", agent_id="a"))
    reveal_type(await remote.consents("alice"))
"""

# What each reveal_type above must show, in order (mypy's spelling).
EXPECTED = [
    "uprof.sdk._client.Client",
    "uprof.schemas.api.CaptureAck",
    "list[uprof.schemas.api.CaptureAck]",
    "int",
    "str",
    "uprof.schemas.api.ConsentWithdrawn",
    "uprof.schemas.api.ErasureReceipt",
    "uprof.schemas.api.ErasureReceipt",
    "uprof.schemas.api.ErasureReceipt",
    # The subject export is a JSON document: pydantic.JsonValue, shown expanded.
    "dict[str, list[...] | dict[str, ...] | str | bool | int | float | None]",
    "uprof.schemas.api.AuditExport",
    "uprof.schemas.api.AuditVerification",
    "uprof.schemas.api.AuditKey",
    "uprof.schemas.api.ProfileSlice",
    "uprof.schemas.api.Profile",
    "uprof.schemas.api.Evidence",
    "list[uprof.schemas.api.Consent]",
    "uprof.schemas.api.WhoAmI",
    "str",
    "dict[str, list[...] | dict[str, ...] | str | bool | int | float | None]",
    "uprof.schemas.api.ProfileSlice",
    "list[uprof.schemas.api.Consent]",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway environment with the uprof wheel installed; returns its python."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    wheels = work / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("uprof-*.whl")
    env_dir = work / "env"
    # Not the base interpreter's site-packages: the dependencies are this venv's (below),
    # and packages installed beside the base interpreter only (IPython, prompt_toolkit: ~300
    # more modules for mypy to analyse, through rich's optional imports) are none of them.
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # The dependencies come from this venv's site-packages, after the environment's own
    # (a path line in a .pth file: this venv's editable uprof finder is not loaded).
    (site / "zz_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return python


def test_the_installed_wheel_is_what_gets_imported(installed: Path) -> None:
    found = subprocess.run(
        [str(installed), "-c", "import uprof, uprof.sdk; print(uprof.__file__)"],
        cwd=installed.parents[1],  # not this checkout, whose uprof/ would come first
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(found).is_relative_to(installed.parents[1]), found
    assert (Path(found).parent / "py.typed").is_file()


def test_sdk_results_type_check_from_the_wheel_and_reveal_no_any(
    installed: Path, tmp_path: Path
) -> None:
    snippet = tmp_path / "use_sdk.py"
    snippet.write_text(SNIPPET, encoding="utf-8")
    mypy = Path(sys.executable).with_name("mypy")
    result = subprocess.run(
        [
            str(mypy),
            "--python-executable",
            str(installed),
            "--strict",
            "--no-incremental",
            "--config-file",
            "",
            str(snippet),
        ],
        cwd=tmp_path,  # away from this repository's sources and its mypy settings
        capture_output=True,
        text=True,
        timeout=600,
    )
    revealed = re.findall(r'note: Revealed type is "(.*)"', result.stdout)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert errors == [], result.stdout
    assert revealed == EXPECTED, result.stdout
    assert not any("Any" in r for r in revealed)
