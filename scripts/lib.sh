# Shared by the scripts: sourced, not run.
#   apt_install PKG...   installs Debian/Ubuntu packages (with sudo when not root);
#                        elsewhere says what to install and stops.
#   need_node MAJOR      checks that node (and npm) of at least MAJOR are there.

log() {
    # The free disk space goes with each phase: a full run builds a lot.
    printf '\n==> %s   [%s free]\n' "$*" "$(df -h . 2>/dev/null | awk 'NR==2 {print $4}')"
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "need root for: $* (run as root, or install sudo)" >&2
        return 1
    fi
}

apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "missing: $* -- this script installs them with apt (Debian, Ubuntu)." >&2
        if [ "$(uname -s)" = "Darwin" ]; then
            echo "On macOS: brew install redis node openjdk chromium chromedriver python3 (names differ a little; see README.md)." >&2
        fi
        return 1
    fi
    if [ -z "${APT_UPDATED:-}" ]; then as_root apt-get update -qq; APT_UPDATED=1; fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

need_node() {
    local want=$1 have
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "node >= $want and npm are required (https://nodejs.org, or your package manager)" >&2
        return 1
    fi
    have=$(node -p 'process.versions.node.split(".")[0]')
    if [ "$have" -lt "$want" ]; then
        echo "node >= $want is required; this is $(node --version)" >&2
        return 1
    fi
}
