# Sourced by setup.sh, test.sh and demo.sh (after they set ROOT): sets PY, the
# Python all three use. It is $PYTHON (default python3), unless that Python
# refuses `pip install` because it is externally managed (PEP 668: a system
# Python of Debian 12, Ubuntu 23.04 and later): then it is the virtual
# environment .venv of this clone, made with that Python on first use (which
# it says) and reused by later runs. The test is pip's own: outside a virtual
# environment, an EXTERNALLY-MANAGED file next to the standard library.
PY=${PYTHON:-python3}
if "$PY" - 2>/dev/null <<'EOF'
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
raise SystemExit(0 if sys.prefix == sys.base_prefix and os.path.isfile(marker) else 1)
EOF
then
  if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
    echo "setup: $PY refuses pip install (externally managed, PEP 668): creating a virtual environment for Flint, $ROOT/.venv, used from now on" >&2
    "$PY" -m venv "$ROOT/.venv" || {
      echo "setup: $PY cannot make a virtual environment (Debian / Ubuntu: apt install python3-venv)" >&2
      exit 1
    }
  fi
  PY="$ROOT/.venv/bin/python"
fi
