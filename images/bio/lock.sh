#!/usr/bin/env bash
# Regenerate images/bio/requirements.txt: the closure of requirements.in at the versions uv.lock
# pins (run after changing the `bio` extra and `uv lock`). tests/test_denoising_image.py checks
# that every pin still matches uv.lock.
set -euo pipefail
cd "$(dirname "$0")/../.."
UV=${UV:-.cache/tools/bin/uv}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$UV" export --frozen --no-hashes --extra bio --no-emit-project --no-header > "$tmp/lock.txt"
# scprep pins pandas<2.1 (wheels built for numpy 1); pyproject.toml overrides it the same way.
echo 'pandas>=2.2,<3' > "$tmp/overrides.txt"
{
    sed -n '1,/^$/p' images/bio/requirements.txt | grep '^#'
    echo
    "$UV" pip compile images/bio/requirements.in -c "$tmp/lock.txt" --override "$tmp/overrides.txt" \
        --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-annotate --no-header --quiet
} > "$tmp/requirements.txt"
mv "$tmp/requirements.txt" images/bio/requirements.txt
