__rr_run() { eval "$__rr_c"; exit; }; __rr_pre() { eval "$__rr_p"; }
# rockroll session: reads one-word operations from stdin; see guest/sessions.py
__rr_d=$1
cd -- "$2" || exit 127
set -m
echo 0 >/proc/self/oom_score_adj
[ -f "$__rr_d/init" ] && . "$__rr_d/init"
while IFS= read -r __rr_op; do
  case $__rr_op in
  run|runx)
    : >"$__rr_d/state"
    ( trap '{ export -p; printf "cd -- %q\n" "$PWD"; } >"$__rr_d/state"' EXIT
      printf 'pid %s\n' "$BASHPID" >&3
      exec 3>&-
      IFS= read -r -d '' __rr_c <"$__rr_d/cmd"
      if [ "$__rr_op" = runx ]; then IFS= read -r -d '' __rr_p <"$__rr_d/pre"; __rr_pre || exit; fi
      __rr_run
    ) </dev/null >&5 2>&6
    __rr_rc=$?
    if [ "$__rr_op" = run ] && [ -s "$__rr_d/state" ]; then
      # $(<f) reads without forking: reload only when cwd or exports changed
      __rr_new=$(<"$__rr_d/state")
      if [ "$__rr_new" != "$__rr_last" ]; then
        compgen -e >"$__rr_d/names"
        mapfile -t __rr_names <"$__rr_d/names"
        unset "${__rr_names[@]}"
        . "$__rr_d/state"
        __rr_last=$__rr_new
      fi
    fi
    printf 'done %s\n' "$__rr_rc" >&3 ;;
  dump)
    { export -p; printf "cd -- %q\n" "$PWD"; } >"$__rr_d/dump"
    printf 'dumped\n' >&3 ;;
  esac
done
