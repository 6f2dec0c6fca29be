__rr_run() { eval "$__rr_c"; exit; }; __rr_pre() { eval "$__rr_p"; }
# rockroll session (POSIX sh): reads one-word operations from stdin; see guest/sessions.py
__rr_d=$1
cd -- "$2" || exit 127
echo 0 >/proc/self/oom_score_adj
__rr_save() {
  __rr_pwd=$PWD; export __rr_pwd
  export -p; echo 'cd -- "$__rr_pwd"; unset __rr_pwd'
}
__rr_cat() {  # a file's text without cat, which a minimal image may lack
  while IFS= read -r __rr_l; do printf '%s\n' "$__rr_l"; done <"$1"
}
__rr_unexport() {  # unset every exported variable; the state re-exports the survivors
  export -p >"$__rr_d/names"
  while IFS= read -r __rr_l; do
    case $__rr_l in
    "export "*) __rr_n=${__rr_l#export }; __rr_n=${__rr_n%%=*}
      case $__rr_n in ''|__rr_*|*[!A-Za-z0-9_]*) ;; *) command unset "$__rr_n" 2>/dev/null ;; esac ;;
    esac
  done <"$__rr_d/names"
}
[ -f "$__rr_d/init" ] && . "$__rr_d/init"
while IFS= read -r __rr_op; do
  case $__rr_op in
  run|runx)
    : >"$__rr_d/state"
    ( trap '__rr_save >"$__rr_d/state"' EXIT
      read -r __rr_st </proc/self/stat
      printf 'pid %s\n' "${__rr_st%% *}" >&3
      exec 3>&-
      __rr_c=$(__rr_cat "$__rr_d/cmd")
      if [ "$__rr_op" = runx ]; then __rr_p=$(__rr_cat "$__rr_d/pre"); __rr_pre || exit; fi
      __rr_run
    ) </dev/null >&5 2>&6
    __rr_rc=$?
    if [ "$__rr_op" = run ] && [ -s "$__rr_d/state" ]; then
      __rr_unexport
      . "$__rr_d/state"
    fi
    printf 'done %s\n' "$__rr_rc" >&3 ;;
  dump)
    __rr_save >"$__rr_d/dump"; unset __rr_pwd
    printf 'dumped\n' >&3 ;;
  esac
done
