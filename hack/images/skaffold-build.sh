#!/usr/bin/env bash
# skaffold's custom builder for one image (skaffold.yaml): the same daemonless build as
# `make images`, then, when skaffold asks for it ($PUSH_IMAGE), a push of the result to $IMAGE.
# Usage (skaffold sets IMAGE and PUSH_IMAGE): hack/images/skaffold-build.sh broker
set -euo pipefail
cd "$(dirname "$0")/../.."
python=.venv/bin/python
[[ -x $python ]] || python=python3
if [[ "${PUSH_IMAGE:-false}" == true ]]; then
  exec "$python" -m local_cluster.image_build "$1" --push "$IMAGE"
fi
exec "$python" -m local_cluster.image_build "$1"
