"""``uprof demo``: the main job on the embedded default, end to end.

Two users talk to two apps over several sessions. The demo grants consent,
captures the scripted conversation through the public API, lets extraction and
projections run, prints each profile in its three layers, the evidence behind
one item and the profile as it stood after the first session.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from domain.errors import ConsentRequiredError
from domain.values import Interaction
from uprof.cli.context import STATE, console, door, settings
from uprof.cli.govern import print_slice
from uprof.cli.render import print_evidence, print_profile

if TYPE_CHECKING:
    from uprof.facade import Facade


@dataclass(frozen=True)
class Turn:
    day: int
    session: str
    app: str
    agent: str
    user: str
    reply: str


PLANNER, CALENDAR = "app:planner", "app:calendar"

#: Written for this project. Each user speaks to a planning assistant and a calendar agent.
SCRIPT: dict[str, list[Turn]] = {
    "maya": [
        Turn(
            1,
            "m1",
            PLANNER,
            "agent:planner",
            "Hi! My name is Maya Lindqvist.",
            "Nice to meet you, Maya.",
        ),
        Turn(
            1,
            "m1",
            PLANNER,
            "agent:planner",
            "I live in Gothenburg and I work as a marine biologist.",
            "That sounds fascinating.",
        ),
        Turn(
            1,
            "m1",
            PLANNER,
            "agent:planner",
            "I'm vegetarian, so please skip the steakhouse ideas.",
            "Noted, vegetarian options only.",
        ),
        Turn(
            1,
            "m1",
            PLANNER,
            "agent:planner",
            "I love kayaking and I hate crowded museums.",
            "Kayaking trips it is.",
        ),
        Turn(
            2,
            "m2",
            CALENDAR,
            "agent:calendar",
            "Every Tuesday I swim at 7am before work.",
            "I'll keep Tuesday mornings free.",
        ),
        Turn(
            2,
            "m2",
            CALENDAR,
            "agent:calendar",
            "I'm planning to visit my sister Elin in Oslo next month.",
            "Shall I look at train times?",
        ),
        Turn(
            3,
            "m3",
            PLANNER,
            "agent:planner",
            "I speak Swedish and English, and I'm learning Portuguese.",
            "Great mix.",
        ),
        Turn(
            3,
            "m3",
            PLANNER,
            "agent:planner",
            "I have a dog named Skipper who comes on every hike.",
            "Dog-friendly trails then.",
        ),
        Turn(
            9,
            "m4",
            PLANNER,
            "agent:planner",
            "Big news: I moved to Lisbon for a new research post.",
            "Congratulations on the move!",
        ),
        Turn(
            9,
            "m4",
            PLANNER,
            "agent:planner",
            "I want to run the Lisbon half marathon in March.",
            "I'll build a training plan.",
        ),
    ],
    "tomas": [
        Turn(
            1,
            "t1",
            PLANNER,
            "agent:planner",
            "I'm Tomas, I work as a software engineer in Brno.",
            "Hello Tomas.",
        ),
        Turn(
            1,
            "t1",
            PLANNER,
            "agent:planner",
            "I'm allergic to peanuts, so be careful with recipes.",
            "Understood, no peanuts.",
        ),
        Turn(
            2,
            "t2",
            CALENDAR,
            "agent:calendar",
            "My daughter Klara has piano lessons every Thursday.",
            "I'll block Thursday afternoons.",
        ),
        Turn(
            2,
            "t2",
            CALENDAR,
            "agent:calendar",
            "I need to renew my passport before the summer.",
            "I'll remind you in April.",
        ),
        Turn(
            4,
            "t3",
            PLANNER,
            "agent:planner",
            "I enjoy board games and I really like Thai food.",
            "Thai night with board games?",
        ),
        Turn(
            4,
            "t3",
            PLANNER,
            "agent:planner",
            "I live in Prague now, actually, not Brno.",
            "Updated.",
        ),
    ],
}

#: What each user agrees to per app: "*" is every category the app's policy lets it hold
#: consent for (the policy decides; the demo's operator records what the users chose).
CONSENTS = (
    (PLANNER, ["*"], ["personalization"]),
    (CALENDAR, ["*"], ["scheduling"]),
)
PURPOSE = {PLANNER: "personalization", CALENDAR: "scheduling"}


def run_script(d: Facade, start: datetime) -> datetime:
    """Capture every user's first session, return the time it was done, then the rest."""
    from uprof.schemas.capture import InteractionIn

    for subject in SCRIPT:
        for app_id, categories, purposes in CONSENTS:
            d.grant_consent(
                subject,
                app_id=app_id,
                categories=categories,
                purposes=purposes,
                collected_by="demo:consent-form",
            )
    first_sessions = {subject: turns[0].session for subject, turns in SCRIPT.items()}
    split: datetime | None = None
    for phase in ("first", "rest"):
        for subject, turns in SCRIPT.items():
            selected = [
                t for t in turns if (t.session == first_sessions[subject]) == (phase == "first")
            ]
            by_app: dict[str, list[Interaction]] = {}
            for i, t in enumerate(selected):
                by_app.setdefault(t.app, []).append(
                    InteractionIn(
                        subject=subject,
                        app_id=t.app,
                        agent_id=t.agent,
                        agent_type=t.agent.split(":")[1],
                        user_input=t.user,
                        agent_response=t.reply,
                        session_id=t.session,
                        occurred_at=start + timedelta(days=t.day, minutes=i),
                        sharing="shared",
                        source_ref=f"{t.session}:{i + 1}",
                        purpose=PURPOSE[t.app],
                    ).to_domain()
                )
            for app_id, rows in by_app.items():  # each app captures as itself
                d.for_app(app_id).capture_many(subject, rows)
        d.process()
        if split is None:
            split = datetime.now(tz=UTC)
    assert split is not None
    return split


def show_slices(d: Facade) -> None:
    """The same question from two apps with different policies: what each sees and why."""
    query = "Plan my next week around my routines, plans and food preferences."
    console.rule("[bold]slices[/]: one query, two apps, different policies")
    for app_id, agent, purpose in (
        (PLANNER, "agent:planner", "personalization"),
        (CALENDAR, "agent:calendar", "scheduling"),
    ):
        result = d.for_app(app_id).slice(
            "maya",
            query,
            budget_tokens=160,
            purpose=purpose,
            agent_id=agent,
            agent_type=agent.split(":")[1],
        )
        print_slice(result, title=f"{app_id} ({purpose})")


def govern(d: Facade, out: Path) -> None:
    """Withdraw a consent with erasure, erase a user, verify the receipt offline, scan residue."""
    from audit.receipts import parse_receipt, verify_receipt
    from uprof.schemas.capture import InteractionIn

    console.rule("[bold]governance[/]")
    calendar = next(c for c in d.consents("maya") if c.app_id == CALENDAR)
    withdrawal = d.withdraw_consent("maya", calendar.consent_id, erase=True)
    erased = withdrawal.counts.get("captures", 0) if withdrawal else 0
    console.print(f"maya withdrew the calendar consent; {erased} calendar events erased")
    try:
        d.for_app(CALENDAR).capture(
            "maya",
            InteractionIn(
                subject="maya",
                app_id=CALENDAR,
                agent_id="agent:calendar",
                user_input="one more",
                occurred_at=datetime.now(tz=UTC),
                purpose="scheduling",
            ).to_domain(),
        )
    except ConsentRequiredError as e:
        console.print(f"next calendar capture refused: [italic]{e}[/]")

    result = d.erase_subject("tomas")
    out.mkdir(parents=True, exist_ok=True)
    receipt_path, key_path = out / "tomas-erasure-receipt.json", out / "audit-public-key.pem"
    receipt_path.write_text(json.dumps(result.receipt, indent=2) + "\n", encoding="utf-8")
    key_path.write_text(d.audit_public_key()["public_key_pem"], encoding="ascii")
    # Offline verification needs only these two files (`uprof audit verify-receipt` does this).
    verify_receipt(
        parse_receipt(receipt_path.read_bytes()),
        key_path.read_bytes(),
        origin=d.audit_public_key()["origin"],
    )
    console.print(
        f"tomas erased; receipt {result.receipt['body']['receipt_id']} verified offline "
        f"with {key_path.name} only ({receipt_path})"
    )
    report = d.residue_scan(["Tomas", "Klara", "peanuts", "Brno", "passport"])
    console.print(
        f"residue scan: {len(report.findings)} findings in {report.files_scanned} files "
        f"and {report.streams_checked} erased streams ({report.events_checked} events checked)"
    )
    for finding in report.findings:
        console.print(f"  [red]{finding.kind}[/] {finding.location}: {finding.detail}")


def demo(
    data_dir: Annotated[Path, typer.Option(help="Where the demo keeps its SQLite stores.")] = Path(
        ".uprof-data/demo"
    ),
    fresh: Annotated[bool, typer.Option(help="Start from an empty data folder.")] = False,
) -> None:
    """Run the scripted two-user, two-app conversation and show the profiles."""
    # A scratch deployment of its own: its key folder beside its data folder and SQLite,
    # whatever the shell's UPROF_KEY_DIR / UPROF_DATABASE_URL name (a deployment's own:
    # --fresh deleted that key folder, and the demo's log raised its checkpoint note; bug IH).
    data_dir = data_dir.expanduser().resolve()
    STATE.data_dir = data_dir
    STATE.key_dir = data_dir.with_name(data_dir.name + ".keys")
    STATE.database_url = ""  # "": SQLite in the data folder (an empty URL reads as none)
    if fresh:
        # The key folder (keys, erasure ledger) goes too: a fresh demo forgets everything.
        paths = settings()
        for folder in (paths.data_dir, paths.key_path):
            if folder.exists():
                shutil.rmtree(folder)
    with door(creates=True) as d:
        console.rule("[bold]uprof demo[/]: capture → consent gate → extraction → projections")
        console.print(
            f"stores: {data_dir} (SQLite: events, views+audit); keys: {settings().key_path}"
        )
        console.print(f"acting as {d.principal.label} (the local operator; apps act as themselves)")
        after_first = run_script(d, datetime(2026, 3, 2, 9, tzinfo=UTC))
        lag = d.lag()
        console.print(
            f"log position {lag.log_position}; extraction pending {lag.extraction_pending}; "
            f"projection pending {lag.projection_pending}"
        )
        for subject in SCRIPT:
            print_profile(console, subject, d.profile(subject))
        maya = d.profile("maya")
        conflicted = next((a for a in maya.attributes if a.key == "home_location"), None)
        if conflicted is not None:
            print_evidence(console, d.evidence("maya", conflicted.item_id))
        print_profile(console, "maya (after session 1)", d.profile("maya", as_of=after_first))
        show_slices(d)
        govern(d, data_dir / "out")
