"""Lock files and key files: the one checked opener of every file uprof flocks, and of
the secrets it reads from the key folder (decisions 0195, 0200).

A lock file is an empty file (or one holding its holder's record) that uprof creates
itself, mode 0600, in a folder of its own: the data folder's SQLite locks
(``uprof.backends.sqlite``), the key folder's ring, audit-key, checkpoint, erasure and
settle-host locks (``uprof.crypto.keydir``, ``audit.keyring``) and a backup's writer
lock (``uprof.services.backup``). Each is opened here, and anything else under its name
is refused: opened as a lock, a symbolic or hard link made uprof create, empty or write
the file it names, anywhere this process may write, and another user's file let that
user hold (block, or reorder) uprof's locks.

It lives in ``audit`` because the audit key ring opens its locks here too, and the
import contracts keep ``audit`` from importing ``uprof`` (pyproject.toml); ``uprof``
imports it from ``uprof.backends``.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from pathlib import Path

from audit.errors import AuditKeyError
from domain.errors import UprofError


class LockFileAccessError(UprofError):
    """A lock file cannot be opened by this process's user (another user's file, a mode
    without read and write, a folder it cannot enter or write)."""

    hint = (
        "run uprof as the user that owns the data folder, or give this user read and "
        "write access to the file and its folder (chown, chmod); nothing was changed"
    )


class LockFileRefusedError(LockFileAccessError):
    """A lock file is not one uprof made: a symbolic or hard link, a folder, a FIFO, a
    socket or a device, another user's file or one other users may write. Opened as a
    lock, a link made uprof create, empty or overwrite the file it names, anywhere this
    process may write (bugs PI, PP); the rest is not a lock of uprof's."""

    hint = (
        "a lock file is an empty file uprof creates itself (mode 0600, owned by the user "
        "that runs uprof): remove this one and start again, and let no other user write "
        "in the data folder or the key folder; nothing was changed"
    )


def lock_file_error(path: str, error: OSError) -> LockFileAccessError:
    """``LockFileAccessError`` for ``path``, which ``os.open`` refused with ``error``:
    whose the file is and its mode when it can be seen, and who this process runs as."""
    whose = "neither it nor its folder can be looked at"
    for what, place in (("", path), ("its folder ", os.path.dirname(path) or ".")):
        try:
            found = os.stat(place)
        except OSError:
            continue
        # A file that is not there yet: the folder it would be created in is to blame.
        whose = f"{what}owned by uid {found.st_uid}, mode {found.st_mode & 0o7777:04o}"
        break
    return LockFileAccessError(
        f"cannot open the lock file {path} ({error.strerror or error}; {whose}; this "
        f"process runs as uid {os.geteuid()})"
    )


def open_lock_file(path: str | os.PathLike[str], *, create: bool = True, new: bool = False) -> int:
    """A descriptor of the lock file ``path`` (created, 0600, if missing and ``create``;
    ``FileNotFoundError`` otherwise), for flock; every lock file uprof flocks is opened
    here (the stores' since bug PI, the key folder's and a backup's since bug PP).

    A file this process's user may not open (another user's, a mode without read and
    write, a folder it cannot write) failed every start with ``PermissionError``'s
    traceback (0180 "Left"): now an error naming the file, its owner and mode, and
    what to do (bug OB). A file that is not one uprof made is refused,
    ``LockFileRefusedError`` (bug PI): a symbolic link is never followed (it made uprof
    create the file it names, anywhere, and a schema lock's holder empties and writes
    its lock file: the linked file was emptied), nor a hard link used, nor a folder,
    FIFO (``O_NONBLOCK``: never waited on), socket or device, nor a file of a user that
    is neither this process's nor the folder's owner, or that other users may write.

    ``new``: the file must not exist yet (``O_EXCL``; ``FileExistsError`` otherwise), for
    a lock whose holder is the only one ever to create it (a backup's writer lock)."""
    path = os.fspath(path)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_CREAT if create or new else 0)
    flags |= os.O_EXCL if new else 0
    try:
        fd = os.open(path, flags, 0o600)
    except PermissionError as error:
        raise lock_file_error(path, error) from None
    except (FileNotFoundError, FileExistsError):
        raise
    except OSError as error:
        raise _refused(path, _not_a_file(path, error)) from None
    try:
        why = _not_a_lock_file(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if why is not None:
        os.close(fd)
        raise _refused(path, why)
    return fd


#: What opening a name with ``O_NOFOLLOW | O_NONBLOCK`` raises when it is not a regular
#: file: ELOOP a symbolic link, EISDIR a folder, ENXIO a socket (or a FIFO opened for
#: writing with no reader), EOPNOTSUPP a socket on some file systems.
_NOT_A_FILE_ERRNOS = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP)


def _not_a_file(path: str, error: OSError) -> str:
    """What ``path`` is (``_file_kind``), when opening it failed because it is not a
    regular file; ``error`` raised again when it failed otherwise, or when the name is
    gone by the time it is looked at."""
    if error.errno not in _NOT_A_FILE_ERRNOS:
        raise error
    try:
        return _file_kind(os.lstat(path).st_mode)
    except OSError:
        raise error from None


def _refused(path: str, what: str) -> LockFileRefusedError:
    return LockFileRefusedError(
        f"refused the lock file {path}: it is {what}, not a lock file uprof made"
    )


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _not_a_lock_file(path: str, found: os.stat_result) -> str | None:
    """Why the file ``found`` (``path``'s, opened without following a link) is not a
    lock file uprof made, or None when it may be one."""
    if not stat.S_ISREG(found.st_mode):
        return _file_kind(found.st_mode)
    # 0: deleted since it was opened (named locks' holders delete theirs), not a link.
    if found.st_nlink > 1:
        return f"a hard link ({found.st_nlink} names of one file)"
    return _not_ours(found, os.path.dirname(path) or ".")


def _not_ours(found: os.stat_result, folder: str) -> str | None:
    """Why a lock file or folder (``found``, in ``folder``) is not this deployment's:
    owned by a user that is neither this process's nor the folder's owner (root running
    a deployment of its service user's may use its files), or writable by other users
    (who could then write the holder's record, or swap the file)."""
    me, folder_owner = os.geteuid(), os.stat(folder).st_uid
    if found.st_uid not in (me, folder_owner):
        return (
            f"owned by uid {found.st_uid}, neither this process's user (uid {me}) nor the "
            f"folder's owner (uid {folder_owner})"
        )
    if found.st_mode & 0o022:
        return f"writable by other users (mode {found.st_mode & 0o7777:04o})"
    return None


def _not_our_folder(folder: str) -> str | None:
    """Why ``folder`` (looked at without following a link) is not a folder this
    deployment made: not a folder at all (a link, a file), or another user's, or writable
    by others (``_not_ours``); None when it may be one. Lock folders and the key folder
    are judged alike."""
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode):
        return _file_kind(found.st_mode)
    return _not_ours(found, os.path.dirname(folder) or ".")


def make_lock_folder(folder: str | os.PathLike[str]) -> None:
    """Create the folder of a family of lock files (mode 0700) unless it is there, and
    refuse it when it is not one uprof made (``check_lock_folder``)."""
    folder = os.fspath(folder)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except PermissionError as error:
        raise lock_file_error(folder, error) from None
    except FileExistsError:
        pass  # a file or a link under its name: refused just below
    check_lock_folder(folder)


def check_lock_folder(folder: str | os.PathLike[str]) -> None:
    """Refuse a folder of lock files (the named locks', the erasures in flight') when it
    is not one uprof made: a symbolic link would put its lock files, created, written and
    deleted, wherever it points; another user's folder lets that user swap them."""
    folder = os.fspath(folder)
    why = _not_our_folder(folder)
    if why is not None:
        raise LockFileRefusedError(
            f"refused the lock folder {folder}: it is {why}, not a folder uprof made"
        )


# ----------------------------------------------------------------- the key folder


class KeyFileRefusedError(AuditKeyError):
    """The key folder, or a secret in it, is not as uprof keeps it: a symbolic link
    (whoever made it chose the keys uprof uses), not a folder or a regular file, another
    user's, or open to other users (the folder writable: key files can be swapped or
    linked in; a file readable: the secret is out). An ``AuditKeyError``: the audit
    signing key's callers see the class they always did (bug PR)."""

    # The folders above too (bug RG): a refusal for one of them told only of the folder.
    hint = (
        "the key folder and its files are uprof's alone: owned by the user that runs "
        "uprof, the folder mode 0700, each file 0600, no links (chown, chmod 700 / 600; "
        "put back the real file, or set UPROF_KEY_DIR to the folder a link points to); "
        "the folders above it owned by that user or root and not writable by others "
        "(chmod go-w, or the sticky bit as /tmp's); nothing was changed"
    )


#: How many symbolic links resolving a key folder may meet, as the kernel's own limit
#: (Linux's MAXSYMLINKS): more is a loop.
MAX_LINKS = 40


def _walked(
    path: Path, what: str, refused: type[UprofError]
) -> tuple[Path, list[tuple[Path, int]]]:
    """``path`` (absolute) resolved a name at a time as the kernel would, and every
    symbolic link met on the way (its path and owner): the configured folder's own, its
    folders', and each hop of a chain. A name not there ends the walk (the store makes
    the rest), unless a link named it: a link to nothing (``refused``, naming ``what``:
    the key folder's or the data folder's)."""
    done = Path(path.anchor)
    # Each name still to walk, and the link whose target it came from (None: the path's).
    todo: list[tuple[str, Path | None]] = [(name, None) for name in path.parts[1:]]
    links: list[tuple[Path, int]] = []
    while todo:
        name, via = todo.pop(0)
        if name == "..":
            done = done.parent
            continue
        step = done / name
        try:
            found = os.lstat(step)
        except FileNotFoundError:
            if via is None:
                return Path(os.path.normpath(step.joinpath(*(n for n, _ in todo)))), links
            how = "" if via == path else f"reached through {via}, "
            raise refused(
                f"refused the {what} {path}: it is {how}a symbolic link to nothing "
                f"({os.readlink(via)}): mount or make its target first"
            ) from None
        if not stat.S_ISLNK(found.st_mode):
            if todo and not stat.S_ISDIR(found.st_mode):
                # A name still to walk under a file: the next look raised
                # ``NotADirectoryError``, a traceback out of the settings (bug XR).
                raise refused(
                    f"refused the {what} {path}: its path runs through {step}, which is a "
                    "file, not a folder"
                )
            done = step
            continue
        links.append((step, found.st_uid))
        if len(links) > MAX_LINKS:
            raise refused(f"refused the {what} {path}: its links loop")
        target = Path(os.readlink(step))
        if target.is_absolute():
            done = Path(target.anchor)
        todo[:0] = [(n, step) for n in target.parts[1 if target.is_absolute() else 0 :]]
    return done, links


def key_folder_target(folder: str | os.PathLike[str]) -> Path:
    """The key folder the configured ``folder`` names, resolved once, at start (review of
    0198-0200, bug PY). A symbolic link as the configured folder (an operator pointing it
    at a mounted volume) is followed when the link itself is this process's user's or its
    parent folder's owner's: whoever made it chose the folder. Its target is then checked
    as any key folder (``check_key_folder``), and every later open uses the resolved
    path, so a link swapped under a running process redirects nothing. A link to nothing
    is refused: following it later would create the key folder wherever it points (a
    volume not mounted: the root file system).

    Every link on the way is held to that rule, not the first alone (root's too, the
    system's own links): each hop of a chain, and a link among the folders above, chooses
    the key folder as much as the first; one owned by another user let that user point
    this deployment at another of this user's key folders (bug QC)."""
    return _folder_target(folder, "key folder", KeyFileRefusedError)


def _folder_target(folder: str | os.PathLike[str], what: str, refused: type[UprofError]) -> Path:
    """``folder`` resolved once by ``key_folder_target``'s rule; ``what`` and ``refused``
    name the folder (the key folder's, the data folder's) and its refusal."""
    path = Path(folder).expanduser().absolute()
    resolved, links = _walked(path, what, refused)
    if not links:
        return resolved
    # Its folder's owner: the nearest folder above that is there (a first start makes the
    # rest; the data folder's parents often are not there yet).
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    me, parent_owner = os.geteuid(), os.stat(parent).st_uid
    for link, owner in links:
        if owner not in (me, parent_owner, 0):
            how = (
                "a symbolic link" if link == path else f"reached through the symbolic link {link},"
            )
            raise refused(
                f"refused the {what} {path}: it is {how} owned by uid {owner}, neither "
                f"this process's user (uid {me}), root, nor its folder's owner (uid "
                f"{parent_owner}): whoever made a link on the way chose the {what}"
            )
        # The link's own folders too (0219-review-of-0216-and-tf, bug TY): in one another
        # user may write, that user renames this user's links among themselves (another
        # of them onto this name is still a link of this user's), or swaps one between
        # the walk's look at its owner and its read of its target.
        why = _above_not_ours(str(link), parent_owner)
        if why is not None:
            how = "a symbolic link" if link == path else f"reached through the symbolic link {link}"
            raise refused(f"refused the {what} {path}: it is {how} {why}")
    return resolved


def _private_group(gid: int, trusted: tuple[int, ...]) -> bool:
    """Whether the group ``gid`` holds no user but ``trusted`` ones: a user private group
    (Debian's and Ubuntu's scheme, whose users' umask 002 makes their folders 0775, the
    group being the user alone), so its write bit lets no one else in. Read from the user
    and group databases; a group they do not know is not private (fail closed)."""
    try:
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    names = set()
    for uid in trusted:
        try:
            names.add(pwd.getpwuid(uid).pw_name)
        except KeyError:
            continue
    if any(member not in names for member in members):
        return False
    return all(user.pw_uid in trusted for user in pwd.getpwall() if user.pw_gid == gid)


def _above_not_ours(folder: str, owner: int) -> str | None:
    """Why a folder above the key (or data) folder (owned by ``owner``) lets another user put
    another folder in its place, under a running process that opens its files by path:
    owned by a user that is neither this process's, root, nor the key folder's, or writable
    by other users without the sticky bit (``/tmp``'s, which keeps them from renaming what
    is not theirs); group-writable counts only when the group is not private
    (``_private_group``: a umask of 002's 0775 folders are the user's alone). A key
    folder in such a folder, moved away and replaced by a link to
    another user's, had its master secret read from there and its next KEK ring written
    there (bug QD)."""
    above = os.path.dirname(os.path.abspath(folder))
    trusted = (os.geteuid(), 0, owner)
    while True:
        found = os.stat(above)
        if found.st_uid not in trusted:
            return f"under {above}, owned by uid {found.st_uid}, who could replace it"
        others = 0o022
        if found.st_mode & 0o020 and _private_group(found.st_gid, trusted):
            others = 0o002
        if found.st_mode & others and not found.st_mode & stat.S_ISVTX:
            mode = found.st_mode & 0o7777
            return f"under {above}, writable by other users (mode {mode:04o}), who could replace it"
        if above == os.path.dirname(above):
            return None
        above = os.path.dirname(above)


def not_ours_to_keep(folder: str | os.PathLike[str]) -> str | None:
    """Why ``folder`` is no safe place for uprof's files: not a folder (a link, a file),
    another user's or writable by others (``_not_our_folder``), or under a folder another
    user may rename it out of and put their own in its place (``_above_not_ours``); None
    when it is. The one rule of the key folder (bugs PR, QD) and the data folder
    (0214-store-damage-in-servers, bug SK)."""
    folder = os.fspath(folder)
    return _not_our_folder(folder) or _above_not_ours(folder, os.lstat(folder).st_uid)


def check_key_folder(folder: str | os.PathLike[str]) -> None:
    """Refuse the key folder unless it is a folder (not a link to one: the settings
    resolve a configured link once, ``key_folder_target``), owned by this process's user
    or its parent folder's owner (root running its service user's deployment), not
    writable by other users (bug PR), and nobody else may replace it (bug QD):
    ``not_ours_to_keep``."""
    why = not_ours_to_keep(folder)
    if why is not None:
        raise KeyFileRefusedError(f"refused the key folder {os.fspath(folder)}: it is {why}")


class DataFolderRefusedError(UprofError):
    """The data folder, or a folder above it, lets another user replace it: its stores
    (the event store, the views) could be swapped for theirs under the deployment, which
    would then write what it captures there (0214-store-damage-in-servers, bug SK)."""

    hint = (
        "the data folder is uprof's alone: owned by the user that runs uprof (or root), "
        "not writable by others, and the folders above it owned by that user or root and "
        "not writable by others (chmod go-w, or the sticky bit as /tmp's); nothing was "
        "changed"
    )


def check_data_folder(folder: str | os.PathLike[str]) -> None:
    """Refuse the data folder by the key folder's rule (``not_ours_to_keep``)."""
    why = not_ours_to_keep(folder)
    if why is not None:
        raise DataFolderRefusedError(f"refused the data folder {os.fspath(folder)}: it is {why}")


def data_folder_target(folder: str | os.PathLike[str]) -> Path:
    """The SQLite data folder the configured ``folder`` names, resolved once, at start, by
    the key folder's rule (``key_folder_target``): a link of this user's (a mounted
    volume) is followed and its target checked by ``check_data_folder``, where the rule
    looked at the link and refused every such deployment (0216-review-of-0211-to-0214,
    bug TC); a link on the way owned by another user, which it followed without a look,
    is refused: that user re-pointed it and the next connections opened their stores
    (bug TD). Every store then opens under the resolved path."""
    return _folder_target(folder, "data folder", DataFolderRefusedError)


def make_key_folder(folder: Path) -> None:
    """Make the key folder (0700) and any folder missing above it, then check it
    (``check_key_folder``). Refused (or failing), it removes the folders it made itself,
    deepest first and only while empty: a refused first start said "nothing was changed"
    and left an empty key folder behind (bug RW). A folder that was there before, or
    that another process made meanwhile (``FileExistsError``), is never removed."""
    missing = []
    above = folder
    while not os.path.lexists(above):
        missing.append(above)
        above = above.parent
    made: list[Path] = []
    try:
        for path in reversed(missing):
            try:
                os.mkdir(path, 0o700 if path == folder else 0o777)  # the umask applies
            except FileExistsError:
                continue
            made.append(path)
        check_key_folder(folder)
    except BaseException:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise


def open_key_file(
    path: str | os.PathLike[str], flags: int = os.O_RDONLY, *, secret: bool = True
) -> int:
    """A descriptor of the file ``path`` in the key folder, opened with ``flags`` (and
    ``O_NOFOLLOW | O_NONBLOCK``; ``FileNotFoundError`` when there is none and ``flags``
    do not create it, as 0600), refused (``KeyFileRefusedError``) unless it is a regular
    file, not a link (a link planted there chose the key, or received the erasure
    ledger's records), owned by this process's user or the folder's owner, and neither
    readable nor writable by other users (bug PR); ``secret=False`` (the erasure ledger:
    ids and keyed hashes, which an operator may have copied back 0644) only not
    writable by them. A second name is allowed: a first
    start links its file into place before it removes the temporary name, and a racing
    start reads it in between."""
    path = os.fspath(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except FileNotFoundError:
        raise
    except OSError as error:
        what = _not_a_file(path, error)
        raise KeyFileRefusedError(f"refused the key file {path}: it is {what}") from None
    try:
        found = os.fstat(fd)
        why = (
            _file_kind(found.st_mode)
            if not stat.S_ISREG(found.st_mode)
            else _not_ours(found, os.path.dirname(path) or ".")
        )
        if why is None and found.st_mode & (0o077 if secret else 0o022):
            why = f"open to other users (mode {found.st_mode & 0o7777:04o}); run `chmod 600` on it"
        if why is not None:
            raise KeyFileRefusedError(f"refused the key file {path}: it is {why}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the secret ``path`` in the key folder, opened by ``open_key_file``."""
    fd = open_key_file(path)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
