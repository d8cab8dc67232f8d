#!/usr/bin/env bash
# Fetches the cuDNN frontend's C++ headers (header-only; NVIDIA ships them in the PyPI wheel
# nvidia-cudnn-frontend, whose include/ folder is the same on every platform) into DEST/include.
#   scripts/cudnn_frontend.sh VERSION DEST
# CMake runs this at configure time when LEANTUNE_CUDA is on and no CUDNN_FRONTEND_INCLUDE_DIR is
# given; a failure (no network, no python3) leaves the build on leantune's own attention kernels.
# Reads PyPI's simple index (PEP 503, what pip reads) with python3's standard library, checks the
# wheel's sha256 from the index, and extracts include/ only.
set -euo pipefail
ver=${1:?usage: cudnn_frontend.sh VERSION DEST}
dest=${2:?usage: cudnn_frontend.sh VERSION DEST}
command -v python3 >/dev/null || { echo "cudnn_frontend.sh: python3 not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$ver" "$tmp" <<'PY'
import hashlib, html.parser, io, sys, urllib.parse, urllib.request, zipfile
ver, out = sys.argv[1], sys.argv[2]
index = "https://pypi.org/simple/nvidia-cudnn-frontend/"


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href"]


page = Links()
page.feed(urllib.request.urlopen(index, timeout=60).read().decode())
prefix = f"nvidia_cudnn_frontend-{ver}-"
wheels = [h for h in page.hrefs
          if urllib.parse.urlparse(h).path.rsplit("/", 1)[-1].startswith(prefix)
          and ".whl" in h]
if not wheels:
    sys.exit(f"no wheel of nvidia-cudnn-frontend {ver} in {index}")
url = urllib.parse.urljoin(index, wheels[0])
data = urllib.request.urlopen(url, timeout=300).read()
frag = urllib.parse.urlparse(url).fragment
if frag.startswith("sha256=") and hashlib.sha256(data).hexdigest() != frag[7:]:
    sys.exit(f"sha256 mismatch for {url}")
z = zipfile.ZipFile(io.BytesIO(data))
names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
if "include/cudnn_frontend.h" not in names:
    sys.exit("the wheel has no include/cudnn_frontend.h")
for n in names:
    z.extract(n, out)
PY
mkdir -p "$dest"
rm -rf "$dest/include"
mv "$tmp/include" "$dest/include"
echo "$ver" >"$dest/VERSION"
echo "cudnn_frontend.sh: cuDNN frontend $ver headers in $dest/include"
