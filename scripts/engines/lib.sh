# Shared by the engine scripts (sourced, not run). Each script defines
# log() and running() before calling these, and start(), stop() and
# status() before run_action.

# set_env FILE NAME VALUE: replaces NAME's export line in the env file the
# engines share (created if missing), leaving the lines of the other engines
# alone, and prints the line.
set_env() {
	local file=$1 line="export $2=$3" tmp
	mkdir -p "$(dirname "$file")"
	touch "$file"
	tmp="$(mktemp "$file.XXXXXX")"
	grep -v "^export $2=" "$file" >"$tmp" || true
	echo "$line" >>"$tmp"
	mv "$tmp" "$file"
	echo "$line"
}

# run_action ACTION: runs the script's start, stop or status.
run_action() {
	case "${1:-}" in
	start) start ;;
	stop) stop ;;
	status) status ;;
	*)
		echo "usage: $0 start|stop|status" >&2
		exit 2
		;;
	esac
}

# stop_pidfile PIDFILE GRACE_SECONDS: SIGTERM the process in PIDFILE, wait up
# to GRACE_SECONDS for it to exit, then SIGKILL it; remove the pidfile.
stop_pidfile() {
	local pidfile=$1 grace=$2 pid
	if ! running; then
		rm -f "$pidfile"
		log "not running"
		return 0
	fi
	pid=$(cat "$pidfile")
	kill -TERM "$pid"
	for _ in $(seq $((grace * 10))); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "pid $pid ignored SIGTERM for ${grace}s; killing it"
		kill -KILL "$pid"
	fi
	rm -f "$pidfile"
	log "stopped"
}
