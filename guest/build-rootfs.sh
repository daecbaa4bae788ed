#!/usr/bin/env bash
# Builds a read-only ext4 root filesystem for Linux function guests of one
# runtime (guest/runtimes/RUNTIME/recipe), or a sandbox template's
# (guest/templates/TEMPLATE/recipe), from Debian packages:
#   1. mmdebstrap --variant=essential + the recipe's packages into a tree (the
#      essential set is there so that maintainer scripts run as in Debian);
#   2. everything outside the Depends/Pre-Depends closure of the recipe's
#      packages (minus its `build-only:` ones) is deleted again, and so are
#      docs, man pages, locales, apt/dpkg caches, logs and the recipe's
#      `strip:` paths;
#   3. the spore layout: /var/task (the code disk's mount point), /var/runtime
#      (bootstrap.py when the runtime has one), /opt, /tmp, /sbin/spore-agent
#      (with --agent), /usr/local/bin/spore-envd (with --envd), the recipe's
#      `user:` account, and its `copy: SRC DEST` files (SRC relative to the
#      recipe's directory; DEST absolute, owned by the user whose home it is
#      in, else by root);
#   4. the recipe's `check:` runs in the tree (chroot) and must pass;
#   5. mkfs.ext4 -d (no loop device, no mount), no journal, shrunk to fit; or,
#      with the recipe's `size:` (a sandbox's writable root, used through a
#      copy-on-write overlay), a journalled file system of that many MiB
#      (sparse: the free space costs no disk).
# The result is cached as
#   ${SPORE_CACHE:-/var/cache/spore}/rootfs-RUNTIME-<sha256>/{rootfs.ext4,manifest.json,build.log}
# keyed by this script, lib.sh, the recipe, the copied files, the agent, bootstrap.py, the Debian
# release and the mirrors' InRelease files (which change whenever the archive
# does, so a rerun on the same archive is a cache hit).
# Usage: guest/build-rootfs.sh RUNTIME [--agent PATH] [--envd PATH] [--recipe FILE]
#        (prints the image path last; --recipe: a sandbox template's recipe
#        from elsewhere, named RUNTIME: `spore sandbox template build` writes one)
# Env:   SPORE_CACHE, SPORE_VERBOSE=1 (stream mmdebstrap's output to stderr),
#        SPORE_RELEASE (default: the host's Debian release).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guest/lib.sh
source "$here/lib.sh"

usage() { die "usage: $0 RUNTIME|TEMPLATE [--agent PATH] [--envd PATH] [--recipe FILE]   (runtimes: $(known_runtimes); sandbox templates: $(known_templates))"; }
known_runtimes() { (cd "$here/runtimes" && ls -d -- */ 2>/dev/null | tr -d / | tr '\n' ' ' | sed 's/ $//'); }
known_templates() { (cd "$here/templates" && ls -d -- */ 2>/dev/null | tr -d / | tr '\n' ' ' | sed 's/ $//'); }

runtime=""
agent=""
envd=""
recipe=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --agent) [[ $# -ge 2 ]] || usage; agent="$2"; shift 2 ;;
        --agent=*) agent="${1#--agent=}"; shift ;;
        --envd) [[ $# -ge 2 ]] || usage; envd="$2"; shift 2 ;;
        --envd=*) envd="${1#--envd=}"; shift ;;
        --recipe) [[ $# -ge 2 ]] || usage; recipe="$2"; shift 2 ;;
        --recipe=*) recipe="${1#--recipe=}"; shift ;;
        -h|--help) usage ;;
        -*) usage ;;
        *) [[ -z $runtime ]] || usage; runtime="$1"; shift ;;
    esac
done
[[ -n $runtime ]] || usage
[[ $runtime =~ ^[a-z0-9][a-z0-9._-]*$ ]] || die "bad runtime name '$runtime'"
# A function runtime (guest/runtimes/), a sandbox template (guest/templates/),
# or a recipe given.
if [[ -n $recipe ]]; then
    [[ -f $recipe ]] || die "recipe not found: $recipe"
    [[ -f $here/runtimes/$runtime/recipe ]] && die "'$runtime' is a runtime's name: name the template otherwise"
else
    recipe="$here/runtimes/$runtime/recipe"
    [[ -f $recipe ]] || recipe="$here/templates/$runtime/recipe"
    [[ -f $recipe ]] || die "unknown runtime or template '$runtime' (runtimes: $(known_runtimes); templates: $(known_templates))"
fi
recipe_dir="$(cd "$(dirname "$recipe")" && pwd)"
if [[ -n $agent ]]; then
    [[ -f $agent ]] || die "agent binary not found: $agent"
    agent="$(cd "$(dirname "$agent")" && pwd)/$(basename "$agent")"
fi
if [[ -n $envd ]]; then
    [[ -f $envd ]] || die "spore-envd binary not found: $envd"
    envd="$(cd "$(dirname "$envd")" && pwd)/$(basename "$envd")"
fi
bootstrap="$here/runtimes/$runtime/bootstrap.py"
[[ -f $bootstrap ]] || bootstrap=""

# recipe_values KEY — the words of every `KEY:` line of the recipe.
recipe_values() {
    sed -e 's/#.*//' "$recipe" | sed -n "s/^[[:space:]]*$1:[[:space:]]*//p" | tr -s ' \t' '\n\n' | sed '/^$/d'
}
mapfile -t packages < <(recipe_values packages)
mapfile -t build_only < <(recipe_values build-only)
mapfile -t strip_globs < <(recipe_values strip)
mapfile -t users < <(recipe_values user)
fs_size_mib="$(recipe_values size | tail -n1)"
[[ -z $fs_size_mib || $fs_size_mib =~ ^[1-9][0-9]*$ ]] || die "size: '$fs_size_mib' is not a number of MiB"
check_cmd="$(sed -n 's/^[[:space:]]*check:[[:space:]]*//p' "$recipe" | tail -n1)"
[[ ${#packages[@]} -gt 0 ]] || die "$recipe names no packages"
# copy: SRC DEST — files put into the image (SRC relative to the recipe's
# directory), each line's two words.
copies=()
copy_hashes=()
while read -r src dst extra; do
    [[ -n $src ]] || continue
    [[ -n $dst && -z $extra ]] || die "copy: '$src $dst $extra': want SRC DEST"
    [[ $src == /* ]] || src="$recipe_dir/$src"
    [[ -f $src ]] || die "copy: $src is not a file"
    [[ $dst == /* && $dst != */../* && $dst != */.. ]] || die "copy: $dst: want an absolute path inside the image"
    copies+=("$src" "$dst")
    copy_hashes+=("copy=$dst:$(sha256sum <"$src" | cut -d' ' -f1):$(stat -c %a "$src")")
done < <(sed -e 's/#.*//' "$recipe" | sed -n 's/^[[:space:]]*copy:[[:space:]]*//p')

# --- Debian release and mirrors: the host's own (so this works wherever the
# host's apt does, closed networks included). apt itself says which sources
# it uses, whatever their format (one-line or deb822).
release="${SPORE_RELEASE:-}"
if [[ -z $release ]]; then
    # shellcheck disable=SC1091
    release="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
fi
[[ -n $release ]] || die "cannot tell the host's Debian release (set SPORE_RELEASE)"
arch="$(dpkg --print-architecture)"

debian_sources() {
    apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(ARCHITECTURE)' 'Created-By: Packages' 2>/dev/null |
        awk -v r="$release" -v a="$arch" '$3 == "main" && $4 == a && ($2 == r || $2 == r "-updates" || $2 == r "-security" || $2 == r "/updates") { print $1, $2 }' |
        LC_ALL=C sort -u
}
mapfile -t sources < <(debian_sources)
if [[ ${#sources[@]} -eq 0 ]]; then
    log "apt knows no $release sources yet: apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    mapfile -t sources < <(debian_sources)
fi
[[ ${#sources[@]} -gt 0 ]] || die "the host's apt has no 'main' source for $release/$arch"
mirrors=()
for s in "${sources[@]}"; do mirrors+=("deb ${s%% *} ${s#* } main"); done

# The host's apt settings that decide whether the mirror is reachable and
# accepted (a proxy; snapshot mirrors whose Release files have expired).
aptopts="$(apt-config dump | grep -E '^Acquire::(https?::Proxy|Check-Valid-Until|Check-Date)' || true)"

# The archive's state: the InRelease file of every suite (its Date and the
# hashes of every index), fetched through apt (its proxy settings apply);
# the host's copy from its last `apt-get update` when the mirror cannot be
# reached (the build would then fail anyway, unless it is cached).
work_key="$(mktemp -d)"
trap 'rm -rf "$work_key"' EXIT
archive_state=()
archive_dates=()
for s in "${sources[@]}"; do
    uri="${s%% *}"
    suite="${s#* }"
    url="${uri%/}/dists/$suite/InRelease"
    f="$work_key/$(tr -c 'a-zA-Z0-9' _ <<<"$url")"
    if ! /usr/lib/apt/apt-helper download-file "$url" "$f" >/dev/null 2>&1; then
        local_copy="/var/lib/apt/lists/$(sed -e 's|^[a-z]*://||' -e 's|/$||' -e 's|/|_|g' <<<"$uri")_dists_$(tr / _ <<<"$suite")_InRelease"
        [[ -f $local_copy ]] || die "cannot fetch $url, and apt has no copy of it"
        log "cannot fetch $url; keying on apt's copy from its last update"
        cp "$local_copy" "$f"
    fi
    archive_state+=("$url=$(sha256sum <"$f" | cut -d' ' -f1)")
    archive_dates+=("$suite: $(sed -n 's/^Date: //p' "$f" | head -n1)")
done
rm -rf "$work_key"
trap - EXIT

key="$(hash_inputs "$here/build-rootfs.sh" "$here/lib.sh" "$recipe" "${copy_hashes[@]}" \
    "agent=${agent:+$(sha256sum <"$agent" | cut -d' ' -f1)}" \
    "envd=${envd:+$(sha256sum <"$envd" | cut -d' ' -f1)}" \
    "bootstrap=${bootstrap:+$(sha256sum <"$bootstrap" | cut -d' ' -f1)}" \
    "release=$release/$arch" "${mirrors[@]}" "$aptopts" "${archive_state[@]}")"
dest="$SPORE_CACHE/rootfs-$runtime-$key"

if [[ -f $dest/rootfs.ext4 ]]; then
    log "cached: $dest/rootfs.ext4"
    echo "$dest/rootfs.ext4"
    exit 0
fi
# Only building needs root (a cached image is found without).
[[ $(id -u) -eq 0 ]] || die "building a runtime image needs root (mmdebstrap --mode=root, chroot for the check)"
# python3: mmdebstrap depends on it, and it does the dependency closure below.
ensure_packages mmdebstrap e2fsprogs python3
with_cache_lock "$dest"
if [[ -f $dest/rootfs.ext4 ]]; then # built by a concurrent run while we waited
    echo "$dest/rootfs.ext4"
    exit 0
fi

started=$(date +%s)
work="$(mktemp -d "$SPORE_CACHE/.rootfs-build.XXXXXX")"
# mmdebstrap mounts /proc, /sys and /dev inside the tree while it installs and
# undoes that itself; should a mount still be there (it was killed), unmount it
# rather than deleting through it. --one-file-system is the second guard.
cleanup() {
    local m
    while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(findmnt -rn -o TARGET | grep -F "$work/" | sort -r)
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
tree="$work/tree"
out="$work/out"
mkdir -p "$tree" "$out"
buildlog="$out/build.log"

step() {
    log "$1"
    shift
    if [[ ${SPORE_VERBOSE:-0} == 1 ]]; then
        "$@" 2>&1 | tee -a "$buildlog" >&2
    elif ! "$@" >>"$buildlog" 2>&1; then
        tail -n 40 "$buildlog" >&2
        die "step failed (the log is in the build dir, deleted on exit; SPORE_VERBOSE=1 streams it)"
    fi
}

printf '%s\n' "$aptopts" >"$work/aptopts"
# usr-is-merged: the essential set's init-system-helpers wants usrmerge |
# usr-is-merged; apt would pick usrmerge, which drags perl in.
include="$(IFS=,; echo "usr-is-merged,${packages[*]}")"
step "mmdebstrap $release ($include)" \
    mmdebstrap --mode=root --variant=essential --include="$include" \
    --aptopt="$work/aptopts" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --dpkgopt='path-exclude=/usr/share/bug/*' \
    "$release" "$tree" "${mirrors[@]}"

# --- Keep the closure of the recipe's packages; delete every other package's
# files (and their dpkg records). Done in Python: Debian dependency fields
# (alternatives, virtual packages, version constraints) are easy to get wrong
# in shell. The deletions run chrooted into the tree, so that no symlink in it
# can lead them outside.
log "keeping the dependency closure of: ${packages[*]} (build-only: ${build_only[*]:-none})"
python3 - "$tree" "${#packages[@]}" "${packages[@]}" "${build_only[@]}" >>"$buildlog" 2>&1 <<'PY' || { tail -n 20 "$buildlog" >&2; die "trimming the tree failed"; }
import os, re, sys

tree = sys.argv[1]
n = int(sys.argv[2])
wanted, build_only = sys.argv[3:3 + n], set(sys.argv[3 + n:])
dpkg = os.path.join(tree, "var/lib/dpkg")
paragraphs = open(os.path.join(dpkg, "status"), encoding="utf-8").read().split("\n\n")

def fields(par):
    out, last = {}, None
    for line in par.splitlines():
        if line[:1] in (" ", "\t") and last:
            out[last] += "\n" + line
        elif ":" in line:
            last, _, v = line.partition(":")
            out[last] = v.strip()
    return out

pkgs = {}
for par in paragraphs:
    f = fields(par)
    if "Package" in f and f.get("Status", "").endswith(" installed"):
        pkgs[f["Package"]] = (f, par)
provides = {}
for name, (f, _) in pkgs.items():
    for p in filter(None, (x.strip() for x in f.get("Provides", "").split(","))):
        provides.setdefault(re.sub(r"\s*\(.*", "", p), []).append(name)

def resolve(alternatives):
    for alt in alternatives.split("|"):
        name = re.sub(r"\s*\(.*|\s*\[.*|:any$", "", alt.strip())
        name = name.split(":")[0]
        if name in pkgs:
            return name
        if name in provides:
            return provides[name][0]
    return None

keep, todo = set(), [w for w in wanted]
missing = [w for w in wanted if w not in pkgs]
if missing:
    sys.exit(f"recipe packages not installed: {missing}")
while todo:
    p = todo.pop()
    if p in keep or p in build_only:
        continue
    keep.add(p)
    f = pkgs[p][0]
    for field in ("Pre-Depends", "Depends"):
        for dep in filter(None, (d.strip() for d in f.get(field, "").split(","))):
            r = resolve(dep)
            if r is not None and r not in keep and r not in build_only:
                todo.append(r)

drop = sorted(set(pkgs) - keep)
print("keep:", " ".join(sorted(keep)))
print("drop:", " ".join(drop))
paths = set()
info = os.path.join(dpkg, "info")
for p in drop:
    for lst in (f"{p}.list", f"{p}:{pkgs[p][0].get('Architecture', '')}.list"):
        path = os.path.join(info, lst)
        if os.path.exists(path):
            paths.update(l.rstrip("\n") for l in open(path, encoding="utf-8", errors="surrogateescape"))
# Paths that a kept package also lists (directories, mostly) stay.
for p in keep:
    for lst in (f"{p}.list", f"{p}:{pkgs[p][0].get('Architecture', '')}.list"):
        path = os.path.join(info, lst)
        if os.path.exists(path):
            paths.difference_update(l.rstrip("\n") for l in open(path, encoding="utf-8", errors="surrogateescape"))

# dpkg's database: only the kept packages (dpkg-query -W works in the guest);
# the per-package file lists and scripts are not needed in a read-only image.
with open(os.path.join(dpkg, "status"), "w", encoding="utf-8") as out:
    out.write("\n\n".join(pkgs[p][1].strip("\n") for p in sorted(keep)) + "\n")

pid = os.fork()
if pid == 0:
    os.chroot(tree)
    os.chdir("/")
    # Files first, then directories deepest first (those still holding
    # something, e.g. another package's files, stay).
    dirs = []
    for p in sorted(paths):
        if not p.startswith("/") or p in ("/", "/."):
            continue
        try:
            if os.path.islink(p):
                # A link to a directory may be the merged-/usr layout
                # (/sbin -> usr/sbin) that some dropped package also lists.
                if not os.path.isdir(p):
                    os.unlink(p)
            elif os.path.isdir(p):
                dirs.append(p)
            else:
                os.unlink(p)
        except FileNotFoundError:
            pass
    for d in sorted(dirs, key=lambda d: d.count("/"), reverse=True):
        try:
            os.rmdir(d)
        except OSError:
            pass
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(0 if status == 0 else "deleting files in the chroot failed")
PY

# --- What no guest reads: docs, caches, logs, apt/dpkg leftovers, the host's
# resolver and host name (mmdebstrap copied them in).
log "stripping docs, locales, caches, logs"
find "$tree/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete 2>/dev/null || true
find "$tree/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf --one-file-system "$tree"/usr/share/{man,info,locale,lintian,bug,doc-base,common-licenses} \
    "$tree"/var/lib/dpkg/{info,status-old,available,triggers,updates,lock,lock-frontend} \
    "$tree"/var/lib/apt "$tree"/var/cache/apt "$tree"/var/cache/debconf "$tree"/var/cache/ldconfig \
    "$tree"/etc/apt "$tree"/etc/dpkg/dpkg.cfg.d/99mmdebstrap "$tree"/var/log/* "$tree"/boot "$tree"/home "$tree"/media "$tree"/srv
mkdir -p "$tree"/var/lib/dpkg/{info,updates}
for g in "${strip_globs[@]}"; do
    [[ $g == /* && $g != *..* ]] || die "strip: '$g' must be an absolute path without .."
    # Unquoted on purpose: the recipe's globs expand inside the tree.
    # shellcheck disable=SC2086
    for p in "$tree"$g; do
        [[ -e $p || -L $p ]] && rm -rf --one-file-system "$p"
    done
done
find "$tree" -xdev \( -name '*.dpkg-old' -o -name '*.dpkg-dist' -o -name '*-old' -path '*/debconf/*' \) -delete

# --- The spore layout.
mkdir -p "$tree"/{var/task,var/runtime,opt,tmp,proc,sys,dev,run,root,usr/local/bin,etc}
chmod 1777 "$tree/tmp"
chmod 0755 "$tree"/var/task "$tree"/var/runtime "$tree"/opt
# The root file system is read-only: the guest's init writes its resolver
# settings to /run (a tmpfs), where this link points.
rm -f "$tree/etc/resolv.conf"
ln -s ../run/resolv.conf "$tree/etc/resolv.conf"
echo spore >"$tree/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$tree/etc/hosts"
if [[ -f $bootstrap ]]; then
    install -m 0755 "$bootstrap" "$tree/var/runtime/bootstrap.py"
fi
if [[ -n $agent ]]; then
    install -m 0755 "$agent" "$tree/usr/sbin/spore-agent"
fi
if [[ -n $envd ]]; then
    install -m 0755 "$envd" "$tree/usr/local/bin/spore-envd"
fi
# The recipe's user accounts (uid 1000 up, a home of their own, bash when the
# image has it), written straight into the databases: no useradd in the tree.
uid=1000
for u in "${users[@]}"; do
    [[ $u =~ ^[a-z_][a-z0-9_-]*$ ]] || die "user: '$u' is not a valid user name"
    shell=/bin/sh
    [[ -x $tree/bin/bash || -x $tree/usr/bin/bash ]] && shell=/bin/bash
    printf '%s:x:%d:%d::/home/%s:%s\n' "$u" "$uid" "$uid" "$u" "$shell" >>"$tree/etc/passwd"
    printf '%s:x:%d:\n' "$u" "$uid" >>"$tree/etc/group"
    [[ -f $tree/etc/shadow ]] && printf '%s:!:19000:0:99999:7:::\n' "$u" >>"$tree/etc/shadow"
    mkdir -p "$tree/home/$u"
    chown "$uid:$uid" "$tree/home/$u"
    chmod 0750 "$tree/home/$u"
    uid=$((uid + 1))
done
# The recipe's files; one in a user's home is that user's.
for ((i = 0; i < ${#copies[@]}; i += 2)); do
    src="${copies[i]}" dst="${copies[i + 1]}"
    install -D -m "$(stat -c %a "$src")" "$src" "$tree$dst"
    owner=0
    if [[ $dst =~ ^/home/([^/]+)/ ]]; then
        owner="$(awk -F: -v u="${BASH_REMATCH[1]}" '$1 == u { print $3 }' "$tree/etc/passwd")"
        [[ -n $owner ]] || owner=0
    fi
    chown "$owner:$owner" "$tree$dst"
    # Directories made for it in a home belong to its owner too.
    d="$(dirname "$dst")"
    while [[ $owner != 0 && $d =~ ^/home/[^/]+/ ]]; do
        chown "$owner:$owner" "$tree$d"
        d="$(dirname "$d")"
    done
done
# busybox's applets where the image has no program of that name (the usual
# small tools for shell bootstraps, without coreutils' 18 MB).
if [[ -x $tree/usr/bin/busybox ]]; then
    for applet in $(chroot "$tree" /usr/bin/busybox --list); do
        exists=0
        for d in usr/bin usr/sbin usr/local/bin; do
            [[ -e $tree/$d/$applet || -L $tree/$d/$applet ]] && exists=1
        done
        [[ $exists == 1 ]] || ln -s /usr/bin/busybox "$tree/usr/local/bin/$applet"
    done
fi
# The linker cache for what is left (libc-bin itself was build-only).
ldconfig -r "$tree"

# --- The recipe's check, in the finished tree. No .pyc or other writes may
# end up in the image, so the check runs with Python's bytecode cache off.
if [[ -n $check_cmd ]]; then
    log "check: $check_cmd"
    if ! check_out="$(env -i PATH=/usr/local/bin:/usr/bin:/usr/sbin HOME=/root PYTHONDONTWRITEBYTECODE=1 \
        chroot "$tree" /bin/sh -c "$check_cmd" 2>&1)"; then
        printf '%s\n' "$check_out" >&2
        die "the $runtime image fails its check"
    fi
    log "check passed: $check_out"
    printf 'check: %s\n' "$check_out" >>"$buildlog"
fi

# --- Manifest data from the tree's own dpkg database.
mapfile -t pkg_lines < <(dpkg-query --admindir="$tree/var/lib/dpkg" -W -f='${Package}\t${Version}\n' | LC_ALL=C sort)
files=$(find "$tree" -xdev | wc -l)

# --- The file system: sized to the tree plus room for ext4's own metadata,
# built from the tree with mkfs.ext4 -d, then shrunk to its minimum (the image
# is read-only: free space would only cost disk). No journal: nothing writes.
# UUID and hash seed come from the key, so the same inputs give the same ids.
uuid="$(sed -E 's/^(.{8})(.{4})(.{4})(.{4})(.{12}).*/\1-\2-\3-\4-\5/' <<<"$key")"
tree_kib=$(du -sx --block-size=1K "$tree" | cut -f1)
inodes=$((files + files / 10 + 64))
size_kib=$((tree_kib + tree_kib / 5 + inodes / 4 + 8192))
journal="^has_journal"
if [[ -n $fs_size_mib ]]; then
    # A writable root: the recipe's size (never less than the tree needs), a
    # journal, inodes for a user's files too.
    ((fs_size_mib * 1024 > size_kib)) && size_kib=$((fs_size_mib * 1024))
    inodes=$((size_kib / 16))
    journal="has_journal"
fi
img="$out/rootfs.ext4"
for attempt in 1 2 3; do
    rm -f "$img"
    truncate -s "${size_kib}K" "$img"
    if mkfs.ext4 -q -F -b 4096 -N "$inodes" -m 0 -O "$journal" -L "spore-$runtime" \
        -U "$uuid" -E "hash_seed=$uuid,root_owner=0:0" -d "$tree" "$img" >>"$buildlog" 2>&1; then
        break
    fi
    [[ $attempt -lt 3 ]] || { tail -n 20 "$buildlog" >&2; die "mkfs.ext4 -d failed"; }
    size_kib=$((size_kib * 3 / 2))
    log "mkfs.ext4 ran out of room; retrying with ${size_kib} KiB"
done
step "e2fsck" e2fsck -fy "$img"
if [[ -z $fs_size_mib ]]; then
    step "resize2fs -M (shrink to fit)" resize2fs -M "$img"
    step "e2fsck after the shrink" e2fsck -fn "$img"
    # resize2fs leaves the file at its old length when shrinking a regular file.
    blocks=$(dumpe2fs -h "$img" 2>/dev/null | sed -n 's/^Block count:[[:space:]]*//p')
    [[ -n $blocks ]] || die "cannot read the image's block count"
    truncate -s $((blocks * 4096)) "$img"
fi
chmod 0644 "$img"

size=$(stat -c %s "$img")
elapsed=$(($(date +%s) - started))
{
    printf '{\n'
    printf '  "runtime": "%s",\n' "$runtime"
    printf '  "image": "rootfs.ext4",\n'
    printf '  "key": "%s",\n' "$key"
    printf '  "size_bytes": %s,\n' "$size"
    printf '  "tree_kib": %s,\n' "$tree_kib"
    printf '  "files": %s,\n' "$files"
    printf '  "uuid": "%s",\n' "$uuid"
    printf '  "release": "%s",\n' "$release"
    printf '  "architecture": "%s",\n' "$arch"
    printf '  "mirrors": [%s],\n' "$(printf '"%s",' "${mirrors[@]}" | sed 's/,$//')"
    printf '  "archive_dates": [%s],\n' "$(printf '"%s",' "${archive_dates[@]}" | sed 's/,$//')"
    printf '  "recipe_packages": [%s],\n' "$(printf '"%s",' "${packages[@]}" | sed 's/,$//')"
    if [[ -n $agent ]]; then
        printf '  "agent": {"present": true, "path": "/sbin/spore-agent", "sha256": "%s"},\n' "$(sha256sum <"$agent" | cut -d' ' -f1)"
    else
        printf '  "agent": {"present": false},\n'
    fi
    if [[ -n $envd ]]; then
        printf '  "envd": {"present": true, "path": "/usr/local/bin/spore-envd", "sha256": "%s"},\n' "$(sha256sum <"$envd" | cut -d' ' -f1)"
    fi
    if [[ -n $bootstrap ]]; then
        printf '  "bootstrap": {"path": "/var/runtime/bootstrap.py", "sha256": "%s"},\n' "$(sha256sum <"$bootstrap" | cut -d' ' -f1)"
    else
        printf '  "bootstrap": null,\n'
    fi
    printf '  "built_at": "%s",\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf '  "build_seconds": %s,\n' "$elapsed"
    printf '  "packages": [\n'
    sep=""
    for l in "${pkg_lines[@]}"; do
        printf '%s    {"name": "%s", "version": "%s"}' "$sep" "${l%%$'\t'*}" "${l#*$'\t'}"
        sep=$',\n'
    done
    printf '\n  ]\n}\n'
} >"$out/manifest.json"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out/manifest.json" || die "wrote a malformed manifest"

sync -f "$img" 2>/dev/null || true
# Rename into place: readers only ever see a complete cache entry.
mv "$out" "$dest"
log "built $dest/rootfs.ext4 ($((size / 1024 / 1024)) MiB, ${#pkg_lines[@]} packages, ${files} files, ${elapsed} s)"
echo "$dest/rootfs.ext4"
