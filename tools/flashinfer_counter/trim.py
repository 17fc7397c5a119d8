"""Unpack a FlashInfer wheel into OUT keeping all files outside flashinfer/data/ and, under it, only KEEP prefixes."""

import sys
import zipfile

whl, out = sys.argv[1], sys.argv[2]
keep = sys.argv[3:]
z = zipfile.ZipFile(whl)
n = kept = 0
for i in z.infolist():
    if i.is_dir():
        continue
    f = i.filename
    n += 1
    if f.startswith("flashinfer/data/") and not any(f.startswith("flashinfer/data/" + k) for k in keep):
        continue
    z.extract(i, out)
    kept += 1
print(whl, "files", n, "kept", kept)
