"""Coding at the edge: pushes coded here by the daemon's plan, and versions received as their
stored records and decoded here, so the wire carries stored bytes, not raw ones (docs/api.md,
"plan" and "Encoded pull"; docs/design.md, "Coding at the edge").

The codec is ckptd's own, through the native module ckptd._native (built by `make`, installed by
`make python-client`). Without it, Client(encoded=True) pushes and pulls as the daemon codes
them, and says so once.

References: per model, the restored body of the last version pushed or pulled encoded is kept
in a directory (<dir>/<model>.safetensors and <model>.json naming its version and SHA-256),
the same files the `ckpt` CLI keeps: the base of the next push's deltas, and what the next pull
is sent "since". Without a directory, a push whose plan has deltas pulls its base first, and a
pull receives the chains from their keyframes."""
import contextlib
import hashlib
import json
import mmap
import os
import shutil
import struct
import tempfile
import warnings

try:
    from . import _native
except ImportError:  # built without the module (a sanitizer build) or installed without it
    _native = None

# What the codec raises: `code` names the failure as the daemon's errors do ("DATA_LOSS", ...).
CodecError = _native.Error if _native else type("CodecError", (RuntimeError,), {})


def _codec_error(code, message):
    error = CodecError(message)
    error.code = code
    return error

_PIECE = 1 << 20
_MAX_HEADER_BYTES = 100_000_000  # a safetensors header's limit, as the daemon's
_warned_unavailable = False

# Answers to a pull "since" a held version after which the chains from their keyframes are
# asked for instead: the version is no longer stored, or what is held is not what its sidecar
# says (or not a safetensors file at all).
_SINCE_UNUSABLE = ("NOT_FOUND", "DATA_LOSS", "FAILED_PRECONDITION", "INVALID_ARGUMENT")


def available():
    """Whether this installation has the codec (ckptd._native)."""
    return _native is not None


def warn_unavailable():
    """Says once per process that encoded transfers fall back to ones the daemon codes."""
    global _warned_unavailable
    if not _warned_unavailable:
        _warned_unavailable = True
        warnings.warn("ckptd: the native codec module (ckptd._native) is not installed, so "
                      "encoded pushes and pulls are coded by the daemon (the wire carries raw "
                      "bytes); `make python-client` installs the client with it",
                      RuntimeWarning, stacklevel=3)


def default_reference_dir(host, port):
    """Where the `ckpt` CLI keeps the references of a server: $XDG_CACHE_HOME/ckpt/references/
    HOST-PORT, else ~/.cache/ckpt/references/HOST-PORT."""
    cache = os.environ.get("XDG_CACHE_HOME")
    cache = os.path.join(cache, "ckpt") if cache else os.path.join(
        os.path.expanduser("~"), ".cache", "ckpt")
    return os.path.join(cache, "references", f"{host}-{port}")


class _CheckpointParts:
    """The checkpoint as the codec reads it, in place: a file mapped whole, or a state dict's
    header and tensor memory (no copy). A context manager: the mapping ends with it."""

    def __init__(self, body):
        self._file = self._map = None
        if body.path is not None:
            self._file = open(body.path, "rb")
            try:
                head = self._file.read(8)
                if len(head) < 8:
                    raise ValueError(f"{body.path!r} is not a safetensors file (shorter than 8 "
                                     "bytes)")
                (length,) = struct.unpack("<Q", head)
                if length > min(_MAX_HEADER_BYTES, os.fstat(self._file.fileno()).st_size - 8):
                    raise ValueError(f"{body.path!r} is not a safetensors file: header length "
                                     f"{length} is larger than the file or the 100 MB limit")
                self.raw_header = head + self._file.read(length)
                self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            except BaseException:
                self._file.close()
                raise
            self.parts = [self._map]
        else:
            self.raw_header = body.prefix
            self.parts = [body.prefix, *body.views]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.parts = None
        if self._map is not None:
            self._map.close()
        if self._file is not None:
            self._file.close()


# Lock files this process holds open: closed in forked children (DataLoader workers forked
# while a push runs), whose copies would otherwise hold the lock for their whole life.
_held_locks = set()


def _close_held_locks():
    for fd in _held_locks:
        os.close(fd)
    _held_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_locks)


@contextlib.contextmanager
def _claimed(reference_dir, model):
    """Holds the model's reference lock in `reference_dir` (the one the `ckpt` CLI takes), so
    that processes sharing the directory never pair one's reference with another's sidecar."""
    import fcntl
    _native.check_model_name(model)
    if not reference_dir:
        yield
        return
    os.makedirs(reference_dir, exist_ok=True)
    fd = os.open(_native.held_reference(reference_dir, model)["lock"],
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _held_locks.add(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        _held_locks.discard(fd)
        os.close(fd)


def _needs_reference(plan):
    return any(t["kind"] == "delta" and t["byte_size"] > 0 for t in plan["tensors"])


def push_encoded(client, model, step, body, push_path, reference_dir, threads, replans, label):
    """One encoded push of `body` (client._Body) as version `step`, planned again (up to
    `replans` times) when another writer moved the model on meanwhile (409 STALE_PLAN). A kept
    reference that does not restore the base (REFERENCE_DRIFTED: a damaged file, found by the
    daemon, or here when the daemon trusts its writers) is forgotten and the base pulled, once.
    Returns the push's answer, with "encoded", "sent_bytes", "reference" and "reference_note"
    added."""
    from .client import CkptdError
    with _claimed(reference_dir, model):
        forgot_reference = False
        attempt = 0
        while True:
            try:
                answer = _push_once(client, model, step, body, push_path, reference_dir,
                                    threads, label)
                if forgot_reference and answer["encoded"]:
                    answer["reference_note"] = "; ".join(filter(None, [
                        "the reference held did not restore the base: pulled again",
                        answer["reference_note"]]))
                return answer
            except CkptdError as error:
                if error.reason == "REFERENCE_DRIFTED" and reference_dir and not forgot_reference:
                    _native.forget_sidecar(reference_dir, model)
                    forgot_reference = True
                    continue
                if error.reason != "STALE_PLAN" or attempt == replans:
                    raise
                attempt += 1


def _push_once(client, model, step, body, push_path, reference_dir, threads, label):
    from .client import CkptdError
    version_path = push_path.split("?", 1)[0]
    scratch = None if reference_dir else tempfile.mkdtemp(prefix="ckptd-reference-")
    try:
        with _CheckpointParts(body) as checkpoint:
            plan_text = client._post_bytes(model, version_path + "/plan", checkpoint.raw_header)
            plan = json.loads(plan_text)
            held = _native.held_reference(reference_dir or scratch, model)
            source, reference_path = "", None
            if _needs_reference(plan):
                base = plan["base"]
                base_sha = base["restored_sha256"]
                if reference_dir and base_sha and held["sha256"] == base_sha:
                    source = "held"
                elif base_sha:
                    pulled = _pull_claimed(client, model, str(base["version"]),
                                           held["path"], reference_dir)
                    if pulled["sha256"] != base_sha:
                        raise CkptdError(409, "FAILED_PRECONDITION",
                                         f"version {base['version']} changed while it was "
                                         "pulled: push again", "STALE_PLAN")
                    source = "pulled"
                else:
                    # The base version was deleted (its data is kept for the chains): nothing to
                    # pull, so the daemon codes this push.
                    answer = client._put_body(model, push_path, body, label)
                    return dict(answer, encoded=False, sent_bytes=body.total, reference="",
                                reference_note="the base version was deleted and cannot be "
                                               "pulled: the server coded this push")
                reference_path = held["path"]
                # Its digest was checked when it was kept (or just now, pulled). A daemon that
                # decodes the payloads refuses a delta coded against a drifted one; one that
                # trusts its writers relies on this check.
                if source == "held" and not plan.get("decode_encoded_payloads", True):
                    try:
                        drifted = _file_sha256(reference_path) != base_sha
                    except OSError:
                        drifted = True  # unreadable: forgotten and pulled, as a damaged one
                    if drifted:
                        raise CkptdError(400, "INVALID_ARGUMENT",
                                         f"the reference kept for {model!r} is not the "
                                         f"reconstruction of version {base['version']}",
                                         "REFERENCE_DRIFTED")
            try:
                answer, coded = _send_encoded(client, model, push_path,
                                              _native.ENCODED_PUSH_MEDIA_TYPE, plan_text,
                                              checkpoint, reference_path, threads, reference_dir,
                                              model, held, step, "restored_sha256")
            except CodecError as error:
                if source != "held":
                    raise
                # A kept reference that cannot be read is forgotten and the base pulled, as a
                # drifted one is (push_encoded).
                raise CkptdError(400, "INVALID_ARGUMENT",
                                 f"the reference kept for {model!r}: {error}",
                                 "REFERENCE_DRIFTED") from error
        return dict(answer, encoded=True, sent_bytes=coded["encoded_bytes"], reference=source,
                    reference_note="")
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def _file_sha256(path):
    """The SHA-256 (hex) of the file at `path`."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(_PIECE):
            sha.update(piece)
    return sha.hexdigest()


def _rank_reference_name(model, rank, world_size):
    """The name a rank's reference is kept under: its part of the model's last version."""
    return f"{model}.rank{int(rank)}-of-{int(world_size)}"


def _delta_slices(plan):
    """The slices ({name: (offsets, shape)}) of the tensors whose owned chunks are deltas: what a
    rank's reference must hold."""
    return {t["name"]: (list(t["slice"]["offsets"]), list(t["slice"]["shape"]))
            for t in plan["tensors"]
            if t["kind"] == "delta" and t["slice"]["owned_chunks"][0] < t["slice"]["owned_chunks"][1]}


def _holds_base_part(held, plan, rank, world_size):
    """Whether `held` (a rank's reference) is its part of the plan's base: the part it pushed as
    this very shard of the base, or pulled from it."""
    base, shard = plan["base"], plan["shard"]
    if held["version"] != base["version"] or not held["sha256"]:
        return False
    pushed = shard["base_shard_sha256"]
    return (len(pushed) == world_size and pushed[rank] == held["sha256"]) \
        or held["sha256"] == base["restored_sha256"]


def _holds_slices(path, wanted):
    """Whether the safetensors file `path` holds each tensor of `wanted` at its slice."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    declared = json.loads(header.get("__metadata__", {}).get("ckptd.slices", "{}"))
    for name, (offsets, shape) in wanted.items():
        if name not in header or list(header[name]["shape"]) != shape:
            return False
        if list(declared.get(name, {}).get("offsets", [0] * len(offsets))) != offsets:
            return False
    return True


def push_shard_encoded(client, model, step, rank, world_size, body, shard_path, reference_dir,
                       threads, replans, label):
    """One encoded shard (rank `rank` of `world_size`) of version `step`: coded here by the
    daemon's plan of the shard, the chunks its slices hold whole against the rank's part of the
    last version (kept in `reference_dir`, or pulled), the rest of its bytes sent raw. Planned
    again (up to `replans` times) on 409 STALE_PLAN. Sent plain (coded by the daemon) when it
    cannot be coded here: no plan is given (an earlier version's upload is in progress, or this
    version is committed: the shard is then compared with the one committed), or no part of
    the base holds its slices. Returns the shard's answer, with "encoded", "sent_bytes",
    "reference" and "reference_note" added."""
    from .client import CkptdError
    name = _rank_reference_name(model, rank, world_size)
    with _claimed(reference_dir, name):
        use_held = True
        for attempt in range(replans + 1):
            try:
                return _push_shard_once(client, model, step, rank, world_size, body,
                                        shard_path, reference_dir, name, threads, label,
                                        use_held=use_held)
            except CkptdError as error:
                if error.code == "INVALID_ARGUMENT" and use_held and reference_dir:
                    # The server refused what was coded against the part held (it does not
                    # restore to what the server holds: kept from a shard a commit dropped and
                    # the server then coded, or damaged): the part is forgotten and pulled.
                    _native.forget_sidecar(reference_dir, name)
                elif error.reason != "STALE_PLAN":
                    raise
                # Planned again (the model moved on, or the commit dropped this shard): the
                # part is pulled.
                use_held = False
                why = error.message
        answer = client._put_body(model, shard_path, body, label)
        return dict(answer, encoded=False, sent_bytes=body.total, reference="",
                    reference_note=f"no current plan ({why}): the server coded this shard")


def _push_shard_once(client, model, step, rank, world_size, body, shard_path, reference_dir,
                     name, threads, label, use_held=True):
    from .client import CkptdError
    path, query = shard_path.split("?", 1)

    def plain(why):
        answer = client._put_body(model, shard_path, body, label)
        return dict(answer, encoded=False, sent_bytes=body.total, reference="",
                    reference_note=f"{why}: the server coded this shard")

    scratch = tempfile.mkdtemp(prefix="ckptd-reference-")
    try:
        with _CheckpointParts(body) as checkpoint:
            try:
                plan_text = client._post_bytes(model, f"{path}/plan?of={int(world_size)}",
                                               checkpoint.raw_header)
            except CkptdError as error:
                if error.code != "FAILED_PRECONDITION" or error.reason == "STALE_PLAN":
                    raise
                # The version is committed (or not above the latest): the plain shard is
                # compared with the one committed, or refused as a push of it would be.
                return plain("no plan")
            plan = json.loads(plan_text)
            if reference_dir and len(plan["shard"]["base_shard_sha256"]) == int(world_size):
                # A base of world_size shards: parts kept for other rank counts are of older
                # versions, which no push codes against.
                _native.forget_other_rank_counts(reference_dir, model, int(world_size))
            held = _native.held_reference(reference_dir or scratch, name)
            source, reference_path = "", None
            wanted = _delta_slices(plan)
            if wanted:
                if use_held and reference_dir and _holds_base_part(held, plan, rank, world_size) \
                        and _holds_slices(held["path"], wanted):
                    source, reference_path = "held", held["path"]
                else:
                    # This rank's part of the base as the daemon cuts it for rank of world_size,
                    # used when it holds this shard's slices.
                    pulled = os.path.join(scratch, "part.safetensors")
                    try:
                        pull_part_encoded(client, model, str(plan["base"]["version"]), pulled,
                                          [("rank", str(int(rank))),
                                           ("of", str(int(world_size)))])
                        if _holds_slices(pulled, wanted):
                            source, reference_path = "pulled", pulled
                    except (CkptdError, CodecError) as error:
                        if error.code not in _SINCE_UNUSABLE:
                            raise
                if reference_path is None:
                    return plain("no part of the base holds this shard's slices")
            # The rank's part is known by the digest of the shard pushed, which the version's
            # layout lists.
            answer, coded = _send_encoded(client, model, shard_path,
                                          _native.ENCODED_SHARD_MEDIA_TYPE, plan_text, checkpoint,
                                          reference_path, threads, reference_dir, name, held, step,
                                          "pushed_sha256")
        return dict(answer, encoded=True, sent_bytes=coded["encoded_bytes"], reference=source,
                    reference_note="")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _keep_part(encoder, reference_dir, name, held, step, digest):
    """Finishes `encoder`; with a `reference_dir`, keeps its reconstruction as reference `name`
    (`held`), known by the coding's `digest`. Returns what was coded."""
    coded = encoder.finish()
    if reference_dir:
        _native.forget_sidecar(reference_dir, name)
        encoder.keep_restored_as(held["path"])
        _native.write_sidecar(reference_dir, name, int(step), coded[digest])
    return coded


def _send_encoded(client, model, path, media_type, plan_text, checkpoint, reference_path,
                  threads, reference_dir, name, held, step, digest):
    """Codes `checkpoint` by `plan_text` against `reference_path` while PUTting it to `path`;
    with a `reference_dir`, keeps the reconstruction as reference `name` (`held`), known by the
    coding's `digest`. Returns (the answer, what was coded)."""
    restored_path = _native.temporary_name_for(held["path"]) if reference_dir else None
    encoder = _native.Encoder(plan_text, checkpoint.parts, reference_path, False, threads,
                              restored_path)
    from .client import CkptdError
    try:
        try:
            answer, refused = client._put_stream(model, path, encoder.read, media_type), None
        except CkptdError as error:
            # SHARDS_DROPPED: this shard is stored (other ranks' were dropped), so what it
            # restores to is this rank's part of the version, kept before the error goes on.
            if error.reason != "SHARDS_DROPPED":
                raise
            answer, refused = None, error
        if refused is not None:
            # The error goes on whether or not the part can be kept (a part not kept only
            # makes the next push pull it).
            try:
                _keep_part(encoder, reference_dir, name, held, step, digest)
            except Exception:  # noqa: BLE001
                pass
            raise refused
        coded = _keep_part(encoder, reference_dir, name, held, step, digest)
    finally:
        encoder.close()
    return answer, coded


def pull_encoded(client, model, version, out_path, reference_dir):
    """Pulls `version` encoded into the safetensors file `out_path` (SHA-256 verified): since
    the version held in `reference_dir` when there is one, which the version pulled then
    replaces unless it is older (or the one held proved damaged). Returns {"version", "sha256",
    "restored_bytes", "received_bytes", "since_version", "verified"}."""
    with _claimed(reference_dir, model):
        return _pull_claimed(client, model, version, out_path, reference_dir)


def _pull_claimed(client, model, version, out_path, reference_dir):
    """pull_encoded, the model's reference lock held by the caller."""
    from .client import CkptdError
    held = None
    if reference_dir:
        held = _native.held_reference(reference_dir, model)
        if held["version"] == 0:
            held = None
    partial = out_path + ".partial"
    unusable = False  # what is held could not serve (not what its sidecar says, or gone)
    try:
        result = None
        if held is not None:
            try:
                result = _pull_once(client, model, version, held, partial)
            except (CkptdError, CodecError) as error:
                if error.code not in _SINCE_UNUSABLE:
                    raise
                unusable = True
        if result is None:
            result = _pull_once(client, model, version, None, partial)
        # The version pulled becomes the one held (the base of the next sync or push) unless it
        # is older than the one held, which is then nearer the next sync and is the next push's
        # base (pushes code against the latest).
        replaces = bool(reference_dir) and (
            held is None or unusable or result["version"] >= held["version"]
            or os.path.abspath(held["path"]) == os.path.abspath(out_path))
        if replaces:
            # Until the new sidecar is written, nothing claims what the reference holds.
            _native.forget_sidecar(reference_dir, model)
        os.replace(partial, out_path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    if replaces:
        kept = _native.held_reference(reference_dir, model)
        if os.path.abspath(kept["path"]) != os.path.abspath(out_path):
            temporary = _native.temporary_name_for(kept["path"])
            try:
                shutil.copyfile(out_path, temporary)
                os.replace(temporary, kept["path"])
            finally:
                if os.path.exists(temporary):
                    os.remove(temporary)
        _native.write_sidecar(reference_dir, model, result["version"], result["sha256"])
    return result


def pull_part_encoded(client, model, version, out_path, query):
    """Pulls the part of `version` that `query` names (tensors, rank and of) encoded into the
    safetensors file `out_path`: the records of the chunks holding it, each checked by its
    checksum (a part announces no SHA-256). The reference held is neither used nor replaced.
    Returns as pull_encoded ("verified" false)."""
    partial = out_path + ".partial"
    try:
        result = _pull_once(client, model, version, None, partial, query)
        os.replace(partial, out_path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return result


def _pull_once(client, model, version, since, partial, query=()):
    """One encoded pull of `version` (the part `query` names, else whole) into `partial`."""
    whole = not query
    query = list(query) + ([("since", str(since["version"]))] if since else [])
    conn, response = client._open_restore(model, version, query,
                                          accept=_native.ENCODED_PULL_MEDIA_TYPE)
    try:
        media_type = (response.getheader("Content-Type") or "").split(";")[0].strip()
        if media_type != _native.ENCODED_PULL_MEDIA_TYPE:
            raise _codec_error("INVALID_ARGUMENT",
                               f"the server answered an encoded pull with {media_type!r}: it "
                               "does not serve encoded pulls (upgrade ckptd)")
        decoder = _native.PullDecoder(since["path"] if since else None, partial,
                                      client._encode_threads)
        received = 0
        while True:
            piece = response.read(_PIECE)
            if not piece:
                break
            received += len(piece)
            decoder.feed(piece)
        result = decoder.finish()
    finally:
        conn.close()
    if result["verified"] != whole:
        raise _codec_error("DATA_LOSS", "the server sent a part of the version asked for whole"
                           if whole else "the server sent the whole version where a part was asked")
    return dict(result, received_bytes=received)
