#!/bin/bash
# CPU dry run of tests/gpu/strided_query_worker.py against SGLang 0.5.10 as the H200 would see it:
# the --release 0.5.10 carry (for this machine's Python 3.11) over only those of the venv's packages
# that the H200 image also has (the device README's list), without .pth files (python -S), then the
# worker three ways: no plugin, plugin 0.5.0 (commit 17040a9), the checkout's plugin.
#
#     tools/strided_query_dry_run.sh [WORK=/tmp/strided-dry] [extra worker flags, e.g. --packed-stand-in]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=$REPO/.venv/bin/python
WORK=${1:-/tmp/strided-dry}
shift || true
mkdir -p "$WORK"
"$PY" "$REPO/tools/gpu_carry.py" --release 0.5.10 --python-version 3.11 --out "$WORK" 2>&1 | grep -v "is ignored" | tail -1
"$PY" - "$WORK/image" <<'EOF'
import importlib.metadata as md, os, pathlib, re, sys, sysconfig
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
text = pathlib.Path("/work/.library/device/KINDS.md").read_text()
image = {norm(x.strip().rstrip(".")) for x in text.split("Packages: ", 1)[1].split("\n", 1)[0].split(",")}
site = pathlib.Path(sysconfig.get_paths()["purelib"])
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for dist in md.distributions(path=[str(site)]):
    if norm(dist.metadata["Name"]) in image:
        for top in {pathlib.PurePath(f).parts[0] for f in dist.files or []}:
            if not top.endswith(".pth") and top != ".." and (site / top).exists() and not (out / top).exists():
                os.symlink(site / top, out / top)
EOF
rm -rf "$WORK/site" "$WORK/plugin-0.5.0" "$WORK/plugin-current"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WORK"/.whl510/*.whl
"$PY" -m zipfile -e "$WORK"/.gpu510/sglang-0.5.10-*.whl "$WORK/site"
for p in 0.5.0 current; do
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/plugin-$p" "$WORK"/.gpu510/plugin-$p/*.whl
done
cd /tmp
for p in none 0.5.0 current; do
    path=$WORK/site
    [ $p = none ] || path=$path:$WORK/plugin-$p
    PYTHONPATH=$path:$WORK/image "$PY" -S "$REPO/tests/gpu/strided_query_worker.py" --cpu-dry-run "$@" >"$WORK/$p.log" 2>&1 || true
    grep '^RESULT:' "$WORK/$p.log" | cut -c8- | "$PY" -c "
import json, sys
r = json.load(sys.stdin); c = r['case']
print('$p: plugin', r['plugin']['version'], 'forward_decode', r['forward_decode_type'], '| wrong rows', c.get('wrong_rows'),
      'of', c.get('rows'), 'first row wrong', c.get('first_row_wrong'), '| max error', c.get('max_abs_error'),
      'tolerance', c.get('tolerance'), 'floor', c.get('floor_max_abs_error_contiguous_q'), c.get('error') or '')
" || { echo "$p: no RESULT"; tail -5 "$WORK/$p.log"; }
done
