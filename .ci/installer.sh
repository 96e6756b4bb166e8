# Sourced by .ci/vllm-tier and .ci/sglang-tier: one installer for the engine tiers' venvs.
#
#   venv_install LOG ARGS...   pip-style install ARGS into the active venv, its output into LOG; exit status the install's
#
# uv (`uv pip install`) resolves and unpacks the engines' dependency trees with less CPU than pip
# (a fresh vLLM venv 62 CPU-s against 85, SGLang's 34 against 66, the same versions of every package;
# docs/guides/ci.md, "Locally" and row 70),
# and CI runs on 2 cores. uv does not read pip's configuration, so this machine's pip settings (`pip config list`:
# files and PIP_* variables) are handed to it as options; a setting with no uv counterpart here, uv that cannot
# be installed, or a uv install that fails, and the install is pip's, as before. DDTREE_INSTALLER=pip forces pip,
# =uv refuses the fallback (a failure is then the run's). uv installs no bytecode (pip's --no-compile).

_installer_uv=""     # the uv binary once found or installed; "none" when pip serves
_installer_args=()   # pip's settings as uv options

# 0 when this machine's pip settings translate to uv options (left in _installer_args), else 1 (why on stderr).
# One value a setting, the one pip's install would use: an environment variable (":env:") over the files, an
# "install" section over "global"; other commands' sections are not the install's. A value written over several
# lines is listed with "\n" between its values (pip prints its repr).
_installer_translate() {
  local line section key value v rank
  local -A chosen=() chosen_rank=()
  local order=()
  _installer_args=(--index-strategy unsafe-best-match)  # pip's rule: the best match over every index, not the first
  while IFS= read -r line; do
    [[ $line == *=* ]] || continue
    key=${line%%=*}; section=${key%.*}; key=${key##*.}; value=${line#*=}; value=${value#\'}; value=${value%\'}
    case $section in global) rank=0 ;; install) rank=1 ;; :env:) rank=2 ;; *) continue ;; esac
    value=${value//\\n/ }
    [[ -v "chosen_rank[$key]" ]] || order+=("$key")
    if [[ ! -v "chosen_rank[$key]" ]] || (( rank >= chosen_rank[$key] )); then
      chosen[$key]=$value; chosen_rank[$key]=$rank
    fi
  done < <(python -m pip config list 2>/dev/null)
  for key in "${order[@]}"; do
    value=${chosen[$key]}
    case $key in
      index-url) _installer_args+=(--index-url "${value// /}") ;;
      extra-index-url) for v in $value; do _installer_args+=(--extra-index-url "$v"); done ;;
      find-links) for v in $value; do _installer_args+=(--find-links "$v"); done ;;
      constraint) for v in $value; do _installer_args+=(--constraint "$v"); done ;;
      no-index) [[ $value =~ ^(1|true|yes|on)$ ]] && _installer_args+=(--no-index) ;;
      cert) export SSL_CERT_FILE="${value// /}" ;;
      timeout | default-timeout) export UV_HTTP_TIMEOUT="${value%%.*}" ;;
      disable-pip-version-check | no-compile | no-cache-dir | progress-bar | root-user-action | retries | quiet | config-file) ;;
      *) echo "installer: pip setting '$key' has no uv counterpart here; installing with pip" >&2; return 1 ;;
    esac
  done
}

# Sets _installer_uv to the uv to use, or "none".
_installer_choose() {
  [[ -n $_installer_uv ]] && return 0
  _installer_uv=none
  local mode=${DDTREE_INSTALLER:-auto}
  case $mode in auto | uv | pip) ;; *) echo "installer: DDTREE_INSTALLER must be auto, uv or pip, not '$mode'" >&2; exit 2 ;; esac
  [[ $mode == pip ]] && return 0
  if ! _installer_translate; then
    [[ $mode == uv ]] && { echo "installer: DDTREE_INSTALLER=uv, but pip's settings do not translate" >&2; exit 2; }
    return 0
  fi
  # uv itself, into the venv being built (one wheel, no dependencies; pip's own settings find it)
  if [[ -x "$VIRTUAL_ENV/bin/uv" ]] || python -m pip install -q --no-compile uv >/dev/null 2>&1; then
    _installer_uv="$VIRTUAL_ENV/bin/uv"
  else
    [[ $mode == uv ]] && { echo "installer: DDTREE_INSTALLER=uv, but uv could not be installed" >&2; exit 2; }
    echo "installer: uv could not be installed; installing with pip" >&2
  fi
}

venv_install() {
  local log=$1; shift
  _installer_choose
  if [[ $_installer_uv != none ]]; then
    local args=() a
    for a in "$@"; do [[ $a == --no-compile ]] || args+=("$a"); done  # uv compiles nothing unless asked
    if "$_installer_uv" pip install --python "$VIRTUAL_ENV/bin/python" "${_installer_args[@]}" "${args[@]}" >"$log" 2>&1; then
      return 0
    fi
    [[ ${DDTREE_INSTALLER:-auto} == uv ]] && return 1
    echo "installer: uv pip install $* failed (its log's end below); trying pip" >&2
    tail -n 20 "$log" >&2
  fi
  python -m pip install "$@" >"$log" 2>&1
}
