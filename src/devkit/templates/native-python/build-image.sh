#!/bin/sh
# The image recipe: a Debian bookworm root with Python and numpy, and ./app at /opt/app.
# Add Debian packages to --packages (e.g. python3-h5py, python3-scipy); --no-push keeps the
# tar local (for `htfaas fn run`), without it the image is pushed and tagged __NAME__.
set -e
cd "$(dirname "$0")"
exec htfaas image build --packages python3-minimal,python3-numpy --add ./app:/opt/app \
  --tag __NAME__ --out __NAME__.tar "$@"
