#!/usr/bin/env bash
# Installs what the deployment files' tests (crates/idemgate-cli/tests/deploy) check them with,
# once per machine, outside the clone, and reuses it afterwards. Prints the install root.
#
#   systemd-analyze   Debian's systemd package, when it is not on PATH: `verify` and
#                     `security --offline` on the systemd unit
#   kubernetes-validate (PyPI), in a virtual environment: the Kubernetes objects against the
#                     API's own schemas
#   @kubernetes-models/prometheus-operator (npm): the ServiceMonitor and the PrometheusRule
#                     against the JSON schemas of prometheus-operator's monitoring.coreos.com/v1
#
#   IDEMGATE_DEPLOY_CHECKS_ROOT   where they go (default ~/.cache/idemgate/deploy-checks-<versions>)
set -euo pipefail
cd "$(dirname "$0")"

kubernetes_validate=1.37.0
prometheus_operator_models=6.0.0
root="${IDEMGATE_DEPLOY_CHECKS_ROOT:-$HOME/.cache/idemgate/deploy-checks-kv$kubernetes_validate-pom$prometheus_operator_models}"
validator="$root/venv/bin/kubernetes-validate"
models="$root/npm/node_modules/@kubernetes-models/prometheus-operator/package.json"

fail() {
  echo "install-deploy-checks: $*" >&2
  exit 1
}

if ! command -v systemd-analyze >/dev/null 2>&1; then
  ./apt-install.sh install-deploy-checks systemd
  command -v systemd-analyze >/dev/null 2>&1 || fail "the systemd package was installed but systemd-analyze is still not on PATH"
fi

if [[ ! -x "$validator" ]]; then
  command -v python3 >/dev/null 2>&1 || fail "python3 is needed for kubernetes-validate"
  echo "install-deploy-checks: installing kubernetes-validate $kubernetes_validate into $root/venv" >&2
  rm -rf "$root/venv"
  python3 -m venv "$root/venv" >&2
  "$root/venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$kubernetes_validate" >&2
  [[ -x "$validator" ]] || fail "the install did not produce $validator"
fi

if [[ ! -f "$models" ]]; then
  command -v npm >/dev/null 2>&1 || ./apt-install.sh install-deploy-checks nodejs npm
  echo "install-deploy-checks: installing @kubernetes-models/prometheus-operator $prometheus_operator_models into $root/npm" >&2
  mkdir -p "$root/npm"
  npm install --prefix "$root/npm" --no-audit --no-fund --silent \
    "@kubernetes-models/prometheus-operator@$prometheus_operator_models" >&2
  [[ -f "$models" ]] || fail "the install did not produce $models"
fi

echo "$root"
