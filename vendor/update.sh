#!/usr/bin/env bash
# The vendored crates are a crates.io release plus the patch series in vendor/patches/NAME/
# (vendor/README.md). This script makes each tree from those two and nothing else:
#
#   vendor/update.sh NAME VERSION   fetch NAME VERSION (hyper, h2), apply its series in order,
#                                   and replace vendor/NAME with the result
#   vendor/update.sh --check        make both trees again in a temp dir (each at the version
#                                   vendor/NAME/Cargo.toml names) and compare them byte for
#                                   byte with the checked-in ones; fails naming what differs
#   vendor/update.sh --diff NAME    print what vendor/NAME has that the series does not make
#                                   (the next patch, to split and describe)
#   vendor/update.sh --diff-release NAME
#                                   print vendor/NAME's whole diff against its release
#   vendor/update.sh --to-git NAME DIR [NEW]
#                                   make DIR a git repository: the release, then one commit per
#                                   patch (its message: the file's short name, a blank line, the
#                                   header); with NEW, the release NEW too, to rebase onto
#   vendor/update.sh --from-git NAME DIR
#                                   write vendor/patches/NAME/ back from DIR's commits after its
#                                   newest release, numbered in order (edit, reorder, split with git)
#
# The release is the .crate cargo downloads (through a throwaway project that depends on
# NAME =VERSION, `cargo fetch`; offline first, so a cached release needs no network), checked
# against vendor/stock/Cargo.lock's checksum when that names the same version, then unpacked
# less what is not the crate's source: cargo's bookkeeping (.cargo-ok, .cargo_vcs_info.json,
# Cargo.toml.orig), the crate's own Cargo.lock (unused for a dependency) and .github.
set -euo pipefail

VENDOR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CRATES=(hyper h2)
NOT_SOURCE=(.cargo-ok .cargo_vcs_info.json Cargo.toml.orig Cargo.lock .github)

die() {
  echo >&2 "vendor/update.sh: $*"
  exit 1
}

usage() {
  sed -n '5,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

known() {
  local c
  for c in "${CRATES[@]}"; do [[ $c == "$1" ]] && return 0; done
  die "unknown crate '$1' (vendored: ${CRATES[*]})"
}

command -v patch >/dev/null || die "GNU patch is needed (apt-get install patch)"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/vendor-update.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# The version vendor/NAME is at: its manifest's [package] version.
vendored_version() {
  local v
  v="$(awk '/^\[package\]/{p=1; next} /^\[/{p=0} p && /^version = /{gsub(/"/, "", $3); print $3; exit}' \
    "$VENDOR/$1/Cargo.toml")"
  [[ -n $v ]] || die "no [package] version in vendor/$1/Cargo.toml"
  echo "$v"
}

# The .crate of NAME VERSION in cargo's download cache, if there.
cached_crate() {
  local home="${CARGO_HOME:-$HOME/.cargo}" f
  for f in "$home"/registry/cache/*/"$1-$2.crate"; do
    [[ -f $f ]] && { echo "$f"; return 0; }
  done
  return 1
}

# Downloads NAME VERSION into cargo's cache through a throwaway project.
cargo_fetch() {
  local name="$1" version="$2" dir="$TMP/fetch-$1-$2" host
  mkdir -p "$dir/src"
  : >"$dir/src/lib.rs"
  cat >"$dir/Cargo.toml" <<EOF
[package]
name = "vendor-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$name = { version = "=$version", default-features = false }

[workspace]
EOF
  host="$(rustc -vV | sed -n 's/^host: //p')"
  if ! cargo fetch --quiet --offline --target "$host" --manifest-path "$dir/Cargo.toml" 2>/dev/null; then
    cargo fetch --quiet --target "$host" --manifest-path "$dir/Cargo.toml" ||
      die "cargo could not fetch $name $version (not in the local cache, and the registry did not give it)"
  fi
}

# The checksum vendor/stock/Cargo.lock holds for NAME VERSION from crates.io, if any.
locked_checksum() {
  local lock="$VENDOR/stock/Cargo.lock"
  [[ -f $lock ]] || return 0
  awk -v name="$1" -v version="$2" '
    /^\[\[package\]\]/ { n = ""; v = ""; s = "" }
    /^name = /     { n = $3; gsub(/"/, "", n) }
    /^version = /  { v = $3; gsub(/"/, "", v) }
    /^source = /   { s = $3 }
    /^checksum = / { c = $3; gsub(/"/, "", c); if (n == name && v == version && s ~ /crates-io/) print c }
  ' "$lock"
}

# Unpacks the release NAME VERSION into DEST (made), its source only.
release() {
  local name="$1" version="$2" dest="$3" crate want got f
  crate="$(cached_crate "$name" "$version")" || {
    cargo_fetch "$name" "$version"
    crate="$(cached_crate "$name" "$version")" || die "cargo fetched $name $version but its .crate is not in the cache"
  }
  want="$(locked_checksum "$name" "$version")"
  if [[ -n $want ]]; then
    got="$(sha256sum "$crate" | cut -d' ' -f1)"
    [[ $got == "$want" ]] || die "$crate: sha256 $got, vendor/stock/Cargo.lock says $want"
  fi
  mkdir -p "$dest"
  # -m: every file dated now, not as packed. A tree made again (a patch dropped or changed) puts
  # back files with their release's date, older than the last build, and cargo, which rebuilds
  # a path dependency only for a file newer than that build, would keep the old one.
  tar -xzf "$crate" -C "$dest" --strip-components=1 -m
  for f in "${NOT_SOURCE[@]}"; do rm -rf "${dest:?}/$f"; done
}

# Applies PATCH to TREE; fails naming the patch and its hunks that no longer apply. Quiet
# unless VERBOSE (then patch's own report: offsets).
apply_series_one() {
  local name="$1" version="$2" tree="$3" p="$4" out
  if ! out="$(patch -d "$tree" -p1 --forward --batch --fuzz=0 --no-backup-if-mismatch -r - <"$p" 2>&1)"; then
    echo >&2 "$out"
    die "vendor/patches/$name/$(basename "$p") does not apply to $name $version: the FAILED hunks above (file and line) need redoing by hand (vendor/README.md, 'Updating')"
  fi
  if [[ -n ${VERBOSE:-} ]]; then
    echo "applied $(basename "$p")"
    grep -E 'offset|fuzz' <<<"$out" | sed 's/^/  /' || true
  fi
}

# Applies vendor/patches/NAME/*.patch in order to TREE.
apply_series() {
  local p
  for p in "$VENDOR/patches/$1"/[0-9][0-9][0-9][0-9]-*.patch; do
    [[ -e $p ]] || die "no patches in vendor/patches/$1/"
    apply_series_one "$1" "$2" "$3" "$p"
  done
}

# Makes NAME VERSION with its series into DEST.
build_tree() {
  release "$1" "$2" "$3"
  apply_series "$1" "$2" "$3"
}

# What vendor/NAME has that BASE (a tree) does not, as one git diff with a/ b/ paths.
diff_against() {
  local name="$1" base="$2" work="$TMP/diff-$1"
  mkdir -p "$work"
  cp -a "$base/." "$work/"
  git -C "$work" init -q
  git -C "$work" add -A -f
  git -C "$work" -c user.name=vendor -c user.email=vendor@localhost -c commit.gpgsign=false \
    commit -q --no-verify -m base
  find "$work" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
  cp -a "$VENDOR/$name/." "$work/"
  git -C "$work" add -A -f
  git -C "$work" diff --cached --no-color --no-renames --no-ext-diff
}

GIT_ID=(-c user.name=vendor -c user.email=vendor@localhost -c commit.gpgsign=false)

# DIR: a git repository holding NAME's release (tagged release-VERSION) and a commit per patch
# of its series (branch `series`); with NEW, also the release NEW as a commit on top of the
# current one (tagged release-NEW), for the series to be rebased onto.
to_git() {
  local name="$1" version="$2" dir="$3" new="${4:-}" p msg
  [[ ! -e $dir ]] || die "$dir exists"
  release "$name" "$version" "$dir"
  git -C "$dir" init -q -b series
  git -C "$dir" add -A -f
  git "${GIT_ID[@]}" -C "$dir" commit -q --no-verify -m "release $name $version"
  git -C "$dir" tag "release-$version"
  for p in "$VENDOR/patches/$name"/[0-9][0-9][0-9][0-9]-*.patch; do
    apply_series_one "$name" "$version" "$dir" "$p"
    msg="$TMP/msg"
    { basename "$p" .patch | cut -c6-; echo; sed '/^diff --git /,$d' "$p"; } >"$msg"
    git -C "$dir" add -A -f
    git "${GIT_ID[@]}" -C "$dir" commit -q --no-verify --cleanup=verbatim -F "$msg"
  done
  echo "$dir: $name $version (tag release-$version), then the series (branch series)"
  [[ -n $new ]] || return 0
  git -C "$dir" checkout -q --detach "release-$version"
  find "$dir" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
  release "$name" "$new" "$dir"
  git -C "$dir" add -A -f
  git "${GIT_ID[@]}" -C "$dir" commit -q --no-verify -m "release $name $new"
  git -C "$dir" tag "release-$new"
  git -C "$dir" checkout -q series
  echo "and $name $new (tag release-$new): git -C $dir rebase --onto release-$new release-$version series"
}

# vendor/patches/NAME/ from DIR's commits after its newest release commit, in order.
from_git() {
  local name="$1" dir="$2" out="$TMP/series" n=0 base c slug
  mkdir -p "$out"
  base="$(git -C "$dir" log -1 --format=%H --grep="^release $name " HEAD)"
  [[ -n $base ]] || die "$dir: no 'release $name VERSION' commit under HEAD"
  for c in $(git -C "$dir" rev-list --reverse "$base..HEAD"); do
    n=$((n + 1))
    slug="$(git -C "$dir" log -1 --format=%s "$c")"
    [[ $slug =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "commit $c: its first line must be the patch's short name (a-z, 0-9, -), not '$slug'"
    {
      # The header, with one blank line before the diff.
      git -C "$dir" log -1 --format=%b "$c" | awk 'NF { while (blank-- > 0) print ""; print; blank = 0; next } { blank++ } END { print "" }'
      git -C "$dir" diff --no-color --no-renames --no-ext-diff "$c^" "$c"
    } >"$out/$(printf %04d "$n")-$slug.patch"
  done
  [[ $n -gt 0 ]] || die "$dir has no commit after its release"
  rm -f "$VENDOR/patches/$name"/[0-9][0-9][0-9][0-9]-*.patch
  cp "$out"/*.patch "$VENDOR/patches/$name/"
  echo "vendor/patches/$name/: $n patches from $dir; now vendor/update.sh $name $(vendored_version "$name") and --check"
}

case "${1:-}" in
  --check)
    [[ $# -eq 1 ]] || usage
    failed=()
    for name in "${CRATES[@]}"; do
      version="$(vendored_version "$name")"
      build_tree "$name" "$version" "$TMP/$name"
      if diff -rq "$TMP/$name" "$VENDOR/$name" >"$TMP/$name.diff"; then
        echo "vendor/$name = $name $version + $(ls "$VENDOR/patches/$name"/*.patch | wc -l) patches: identical"
      else
        sed "s|$TMP/$name|(release + series)|g; s|$VENDOR/|vendor/|g" "$TMP/$name.diff" >&2
        failed+=("vendor/$name")
      fi
    done
    if [[ ${#failed[@]} -gt 0 ]]; then
      die "${failed[*]}: not the release + series (files above): make the change a patch (vendor/README.md, 'Changing a patch')"
    fi
    ;;
  --diff | --diff-release)
    [[ $# -eq 2 ]] || usage
    known "$2"
    version="$(vendored_version "$2")"
    release "$2" "$version" "$TMP/base"
    [[ $1 == --diff ]] && apply_series "$2" "$version" "$TMP/base"
    diff_against "$2" "$TMP/base"
    ;;
  --to-git)
    [[ $# -eq 3 || $# -eq 4 ]] || usage
    known "$2"
    to_git "$2" "$(vendored_version "$2")" "$3" "${4:-}"
    ;;
  --from-git)
    [[ $# -eq 3 ]] || usage
    known "$2"
    from_git "$2" "$3"
    ;;
  -* | "")
    usage
    ;;
  *)
    [[ $# -eq 2 ]] || usage
    known "$1"
    VERBOSE=1 build_tree "$1" "$2" "$TMP/tree"
    rm -rf "${VENDOR:?}/$1"
    cp -a "$TMP/tree" "$VENDOR/$1"
    echo "vendor/$1 is now $1 $2 + its series. Next: cargo update -p $1 (and in fuzz/),"
    echo "scripts/test-stock.sh --update-lock if the release changed, then scripts/test.sh."
    ;;
esac
