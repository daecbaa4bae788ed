"""spore-envd's /files endpoints and filesystem service, driven by the
unmodified e2b SDK (see envd_common.py for how the Sandbox is built)."""
import hashlib
import io
import os
import stat
import time

from e2b import AuthenticationException, FileType, InvalidArgumentException, NotFoundException
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

from envd_common import check, envd_is_root, exists, home, isdir, isfile, listdir, q, sandbox, sh

sbx = sandbox()
files = sbx.files
HOME = home()


def p(*parts):
    return os.path.join(HOME, *parts)


def entries_in(directory):
    return listdir(sbx, directory)


# --- write and read ---------------------------------------------------------

info = files.write("hello.txt", "héllo wörld\n")
check(info.path == p("hello.txt") and info.name == "hello.txt", f"a relative path lands under home: {info}")
check(info.type == FileType.FILE, "the write says it wrote a file")
check(files.read("hello.txt") == "héllo wörld\n", "read as text gives what was written")

blob = bytes(range(256)) * 40
info = files.write("a/b/c/data.bin", blob)
check(isfile(sbx, p("a/b/c/data.bin")), "missing parents are created")
check(bytes(files.read(p("a/b/c/data.bin"), format="bytes")) == blob, "read as bytes is byte-equal")
with files.read("a/b/c/data.bin", format="stream") as stream:
    check(b"".join(stream) == blob, "read as a stream is byte-equal")

# 20 MB on a host; through the nested tier's emulated network (QEMU's user
# network under TCG, then vsock) an upload crawls, so the driver asks for less.
BIG_MIB = int(os.environ.get("ENVD_BIG_MIB", "20"))
big = os.urandom(BIG_MIB << 20)
digest = hashlib.sha256(big).hexdigest()
files.write("big/multipart.bin", big)
check(hashlib.sha256(bytes(files.read("big/multipart.bin", format="bytes"))).hexdigest() == digest,
      f"a {BIG_MIB} MB multipart upload reads back byte-equal")
files.write("big/octet.bin", io.BytesIO(big))  # a file-like goes as a streamed octet-stream
with files.read("big/octet.bin", format="stream") as stream:
    h = hashlib.sha256()
    for chunk in stream:
        h.update(chunk)
check(h.hexdigest() == digest, f"a {BIG_MIB} MB octet-stream upload streams back byte-equal")
check(not any(n.startswith(".spore-upload.") for n in entries_in(p("big"))), "no temporary files are left")

files.write("over.txt", "first version, longer")
files.write("over.txt", "second")
check(files.read("over.txt") == "second", "a write replaces the old content")

written = files.write_files([
    {"path": "many/one.txt", "data": "1"},
    {"path": p("many/two.txt"), "data": b"22"},
    {"path": "many/deep/three.txt", "data": "333"},
])
check([w.path for w in written] == [p("many/one.txt"), p("many/two.txt"), p("many/deep/three.txt")],
      f"write_files reports each file: {[w.path for w in written]}")
check([files.read(w.path) for w in written] == ["1", "22", "333"], "write_files wrote each file")

text = "squeeze me " * 10000
files.write("gz/text.txt", text, gzip=True)
check(files.read("gz/text.txt") == text, "a gzip upload is stored decompressed")
check(files.read("gz/text.txt", gzip=True) == text, "a gzip download reads back equal")
check(bytes(files.read("a/b/c/data.bin", format="bytes", gzip=True)) == blob, "gzip downloads of binary data")

try:
    files.read("no/such/file.txt")
    check(False, "reading a missing file raises")
except NotFoundException as e:
    check(True, f"reading a missing file raises {type(e).__name__}")

try:
    files.read("a")
    check(False, "reading a directory raises")
except InvalidArgumentException:
    check(True, "reading a directory raises InvalidArgumentException")

try:
    files.write("hello.txt/inside", "x")
    check(False, "writing under a file raises")
except InvalidArgumentException:
    check(not exists(sbx, p("hello.txt/inside")) and files.read("hello.txt") == "héllo wörld\n",
          "writing under a file raises InvalidArgumentException and changes nothing")


def failing_chunks():
    yield b"x" * (1 << 20)
    raise RuntimeError("the producer failed")


files.make_dir("broken")
raised = False
try:
    files.write("broken/half.bin", failing_chunks())
except Exception:  # the SDK passes the producer's error on
    raised = True
check(raised, "an upload whose data fails midway raises")
deadline = time.time() + 5
while entries_in(p("broken")) and time.time() < deadline:
    time.sleep(0.05)
check(entries_in(p("broken")) == [], "a failed upload leaves nothing behind")

if envd_is_root(sbx):
    nobody = sh(sbx, "id -u nobody; id -g nobody").split()


    def owner(path):
        return sh(sbx, f"stat -c '%u %g' {q(path)}").split()


    # Absolute paths: a relative one would be from nobody's home.
    files.write(p("owned/by/nobody.txt"), "mine", user="nobody")
    check(owner(p("owned/by/nobody.txt")) == nobody, "an upload for another user is theirs")
    check(owner(p("owned/by"))[0] == nobody[0], "so are the directories made for it")
    check(files.make_dir(p("owned/dir"), user="nobody") and owner(p("owned/dir"))[0] == nobody[0],
          "make_dir for another user makes it theirs")
    check(files.get_info("owned/dir").owner == "nobody", "get_info names the owner")

# --- list, stat, make_dir, rename, remove -----------------------------------

names = sorted(e.name for e in files.list("a", depth=1))
check(names == ["b"], f"list depth 1: {names}")
listed = {e.path: e for e in files.list("a", depth=2)}
check(sorted(listed) == [p("a/b"), p("a/b/c")], f"list depth 2: {sorted(listed)}")
check(listed[p("a/b")].type == FileType.DIR, "directories are listed as dirs")
deep = sorted(e.path for e in files.list("a", depth=3))
check(deep == [p("a/b"), p("a/b/c"), p("a/b/c/data.bin")], f"list depth 3: {deep}")

check(files.exists("hello.txt") and not files.exists("nope.txt"), "exists")
entry = files.get_info("a/b/c/data.bin")
mode = int(sh(sbx, f"stat -c %f {q(p('a/b/c/data.bin'))}"), 16)
mtime = int(sh(sbx, f"stat -c %Y {q(p('a/b/c/data.bin'))}"))
check(entry.type == FileType.FILE and entry.size == len(blob), f"get_info type and size: {entry}")
check(entry.permissions == stat.filemode(mode), f"get_info permissions {entry.permissions!r}")
check(entry.mode == mode & 0o777, f"get_info mode {oct(entry.mode)}")
check(entry.path == p("a/b/c/data.bin") and entry.name == "data.bin", "get_info path and name")
check(abs(entry.modified_time.timestamp() - mtime) < 2, "get_info mtime")
dir_entry = files.get_info("a")
check(dir_entry.type == FileType.DIR and dir_entry.permissions.startswith("d"), f"a directory: {dir_entry}")

sh(sbx, f"ln -s {q(p('hello.txt'))} {q(p('link.txt'))}")
link = files.get_info("link.txt")
check(link.type == FileType.SYMLINK and link.symlink_target == p("hello.txt"), f"a symlink: {link}")
check(files.read("link.txt") == "héllo wörld\n", "a symlink reads as its target")

check(files.make_dir("made/x/y") is True and isdir(sbx, p("made/x/y")), "make_dir creates parents")
check(files.make_dir("made/x/y") is False, "make_dir of an existing directory says False")

moved = files.rename("over.txt", "moved/into/here.txt")
check(moved.path == p("moved/into/here.txt") and files.read(moved.path) == "second", "rename moves, making parents")
check(not files.exists("over.txt"), "rename leaves nothing at the old path")
try:
    files.rename("not-there", "elsewhere")
    check(False, "renaming a missing file raises")
except NotFoundException:
    check(True, "renaming a missing file raises NotFoundException")

files.remove("hello.txt")
check(not exists(sbx, p("hello.txt")), "remove a file")
files.remove("a")
check(not exists(sbx, p("a")), "remove a directory tree")
files.remove("never-was")
check(True, "removing a missing path is not an error")

# --- watching ---------------------------------------------------------------


def wait_for(handle, wanted, timeout=10):
    """Events from `handle` until each (name, type) in `wanted` was seen."""
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        seen += [(e.name, e.type) for e in handle.get_new_events()]
        if all(w in seen for w in wanted):
            break
        time.sleep(0.1)
    return seen


files.make_dir("watched")
handle = files.watch_dir("watched")
files.write("watched/w.txt", "data")
files.remove("watched/w.txt")
wanted = [("w.txt", FilesystemEventType.CREATE), ("w.txt", FilesystemEventType.WRITE),
          ("w.txt", FilesystemEventType.REMOVE)]
seen = wait_for(handle, wanted)
check(all(w in seen for w in wanted), f"watch_dir reports create, write and remove: {seen}")
check(not any(name.startswith(".spore-upload.") for name, _ in seen), "uploads' temporary files are not reported")
handle.stop()

handle = files.watch_dir("watched", recursive=True)
files.make_dir("watched/later")
files.write("watched/later/f.txt", "x")
wanted = [("later", FilesystemEventType.CREATE), ("later/f.txt", FilesystemEventType.CREATE)]
seen = wait_for(handle, wanted)
check(all(w in seen for w in wanted), f"a recursive watch sees into a directory made after it started: {seen}")
handle.stop()
raised = False
try:
    handle.get_new_events()
except Exception:
    raised = True
check(raised, "a stopped watcher cannot be read")

try:
    files.watch_dir("no-such-dir")
    check(False, "watching a missing directory raises")
except NotFoundException:
    check(True, "watching a missing directory raises NotFoundException")

# --- authentication ---------------------------------------------------------

bad = sandbox(token="wrong")
for what, call in [("read", lambda: bad.files.read(p("many/one.txt"))),
                   ("write", lambda: bad.files.write("x.txt", "x")),
                   ("list", lambda: bad.files.list(HOME))]:
    try:
        call()
        check(False, f"{what} with a wrong access token raises")
    except AuthenticationException:
        check(True, f"{what} with a wrong access token raises AuthenticationException")
check(not exists(sbx, p("x.txt")), "nothing was written without the token")

print("envd_files: all good")
