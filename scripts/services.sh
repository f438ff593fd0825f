#!/usr/bin/env bash
# The RabbitMQ and the PostgreSQL the project talks to. For each, from the URL configured
# (SAGA_AMQP_URL, SAGA_DATABASE_URL; the README's defaults when unset), the first that works:
#   1. it answers: used as it is;
#   2. it is this machine's own service on its default port, installed but stopped, and we are
#      root: that service is started (as before; this script never stops it);
#   3. the server is installed: a private instance under .saga/services (SAGA_SERVICES_DIR) on
#      free ports of 127.0.0.1, found running or started again from its data on the next run;
#   4. it is not installed, we are root and have apt-get: Debian's package is installed, then 1-3;
#   5. a Docker engine answers: a container of the official image, on free ports;
# else it says what to install. Only a URL that names this machine gets 2-5.
# One line per service says which it did and how to stop it. The URLs of the private instances
# go to .saga/services.env, which setup.sh, run.sh and test.sh source.
#
#   scripts/services.sh         make both reachable (idempotent)
#   scripts/services.sh stop    stop the private instances and containers, never the machine's
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(realpath -m "${SAGA_SERVICES_DIR:-$repo/.saga/services}")
env_file=$dir.env
# Ports never handed to a private instance: the machine's own services use them.
reserved=" 4369 5432 5672 15672 25672 "
# Debian does not put initdb and pg_ctl on PATH.
pg_globs=(/usr/lib/postgresql/*/bin /usr/pgsql-*/bin)
# A node name of its own (the machine's node is rabbit@localhost), fixed per services directory
# so that a second run finds the node the first one started.
node=saga-$(printf %s "$dir" | sha256sum | cut -c1-10)@localhost
project=saga-services-$(printf %s "$dir" | sha256sum | cut -c1-10)
env_lines=()
failed=0

# One run at a time per services directory: two would start the same node twice. The servers
# started below must not inherit the lock (9>&-), or they would hold it for as long as they run.
(umask 022 && mkdir -p "$(dirname "$dir")")
exec 9> "$dir.lock"
if ! flock -w 600 9; then
    printf '%s\n' "scripts/services.sh: another run has held $dir.lock for 10 minutes" >&2
    exit 1
fi

# --- small helpers -------------------------------------------------------------------------------

say() { printf '%s\n' "$*"; }
fail() {
    printf '%s\n' "$*" >&2
    failed=1
}
is_root() { [ "$(id -u)" = 0 ]; }
shown() { printf %s "${1#"$repo"/}"; } # a path under the project, as the README writes it

# shellcheck disable=SC2016 # $0 and $1 are the inner shell's
reachable() { timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2> /dev/null; }

wait_port() { # PORT SECONDS [PROBE]: PROBE failing means the server died, no use waiting
    local deadline=$((SECONDS + $2))
    until reachable 127.0.0.1 "$1"; do
        if [ "$SECONDS" -ge "$deadline" ] || { [ -n "${3:-}" ] && ! "$3"; }; then return 1; fi
        sleep 0.2
    done
}

# Ports handed out by this run, so that two of them never coincide.
taken=" "
# Below the kernel's ephemeral range: a server restarted on a port in that range can find it
# taken meanwhile by any process's outgoing connection, and fail with eaddrinuse.
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2> /dev/null)
case "$ephemeral_low" in
    '' | *[!0-9]*) ephemeral_low=32768 ;; # unreadable: Linux's default
esac
if [ "$ephemeral_low" -lt 12000 ]; then ephemeral_low=32768; fi # too few ports below it
free_port() { # VAR: set to a port nothing on 127.0.0.1 listens on
    local port
    for _ in $(seq 1 200); do
        port=$((10000 + RANDOM % (ephemeral_low - 10000)))
        case "$reserved$taken" in *" $port "*) continue ;; esac
        if ! reachable 127.0.0.1 "$port"; then
            taken="$taken$port "
            printf -v "$1" %s "$port"
            return 0
        fi
    done
    fail "no free port found on 127.0.0.1"
    return 1
}

# Splits URL into $scheme $host $port $path (the query is dropped: TLS options and the like do
# not apply to a private instance).
split_url() {
    local pattern='^([a-z]+)://([^/@]*@)?(\[[^]/]*\]|[^:/?#]*)(:([0-9]+))?([^?#]*)'
    if [[ ! $1 =~ $pattern ]]; then return 1; fi
    scheme=${BASH_REMATCH[1]} host=${BASH_REMATCH[3]} port=${BASH_REMATCH[5]}
    path=${BASH_REMATCH[6]}
    host=${host#[} host=${host%]}
    if [ -z "$port" ]; then
        case "$scheme" in amqps) port=5671 ;; amqp) port=5672 ;; *) port=5432 ;; esac
    fi
}

named_by() { # VARIABLE: where the URL came from
    if [ -n "${!1:-}" ]; then printf %s "$1"; else printf %s "the default URL; $1 sets another"; fi
}

is_local() { case "$1" in 127.* | localhost | ::1 | "") return 0 ;; *) return 1 ;; esac }

# The servers run as their own accounts when we are root: initdb refuses root, and the
# broker's account holds the Erlang cookie that rabbitmqctl (the wrapper, as root) presents.
as_owner() { # USER COMMAND...
    local user=$1
    shift
    if is_root; then runuser -u "$user" -- "$@"; else "$@"; fi
}

own_dir() { # PATH USER: a directory USER can write, made readable along the way
    (umask 022 && mkdir -p "$1")
    if is_root; then
        if ! id -u "$2" > /dev/null 2>&1; then
            fail "$3: no user $2 to run it as (initdb and the broker refuse root): create it," \
                "or run this as an ordinary user"
            return 1
        fi
        chown "$2:" "$1"
    fi
    if ! as_owner "$2" test -w "$1"; then
        fail "$3: $2 cannot write $(shown "$1") (a parent directory is closed to it): set" \
            "SAGA_SERVICES_DIR to a directory it can reach"
        return 1
    fi
}

alive() { # PID: running, and not a zombie waiting to be reaped
    [ -n "$1" ] && [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2> /dev/null
}

apt_install() { # PACKAGE: Debian's package, when we may
    if ! is_root || ! command -v apt-get > /dev/null; then return 1; fi
    local log=$dir/apt-$1.log
    (umask 022 && mkdir -p "$dir")
    export DEBIAN_FRONTEND=noninteractive
    # The packages' scripts start the machine's services: they must not inherit the lock either.
    apt-get install -y -qq "$1" > "$log" 2>&1 9>&- ||
        { apt-get update -qq >> "$log" 2>&1 && apt-get install -y -qq "$1" >> "$log" 2>&1 9>&-; }
}

docker_ready() {
    command -v docker > /dev/null && timeout 20 docker info > /dev/null 2>&1 &&
        docker compose version > /dev/null 2>&1
}

# One compose file for both services (written once, so their ports stay put between runs); each
# run starts only the service it needs.
compose_file=$dir/compose.yml
compose() { docker compose -p "$project" -f "$compose_file" "$@"; }
compose_port() { grep -o "127.0.0.1:[0-9]*:$1\"" "$compose_file" | cut -d: -f2 | head -n 1; }
docker_up() { # SERVICE
    if [ ! -f "$compose_file" ]; then
        local amqp management database
        free_port amqp && free_port management && free_port database || return 1
        (umask 022 && mkdir -p "$dir")
        # The official images let guest in from outside the container and Postgres trust every
        # client, as the machine's own services do; the ports bind 127.0.0.1 only. Docker opens
        # a published port before the server behind it listens: `up --wait` waits for the
        # health checks instead (pg_isready over TCP: during its first initdb the image's
        # server listens on a socket only).
        cat > "$compose_file" <<- EOF
			# Written by scripts/services.sh: private services for this project.
			services:
			  rabbitmq:
			    image: rabbitmq:3.13-management
			    ports: ["127.0.0.1:$amqp:5672", "127.0.0.1:$management:15672"]
			    volumes:
			      - rabbitmq:/var/lib/rabbitmq
			      - "$repo/deploy/compose/rabbitmq.conf:/etc/rabbitmq/conf.d/10-saga.conf:ro"
			    healthcheck:
			      test: ["CMD", "rabbitmq-diagnostics", "-q", "check_port_connectivity"]
			      interval: 3s
			      retries: 60
			  postgres:
			    image: postgres:15
			    environment: {POSTGRES_HOST_AUTH_METHOD: trust}
			    ports: ["127.0.0.1:$database:5432"]
			    volumes: [postgres:/var/lib/postgresql/data]
			    healthcheck:
			      test: ["CMD", "pg_isready", "-U", "postgres", "-h", "127.0.0.1"]
			      interval: 2s
			      retries: 60
			volumes: {rabbitmq: {}, postgres: {}}
		EOF
    fi
    compose up -d --wait "$1" > "$dir/docker-$1.log" 2>&1 9>&-
}

# --- RabbitMQ ------------------------------------------------------------------------------------

rabbit_bin() {
    local found
    if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
        printf '%s\n' /usr/lib/rabbitmq/bin # the scripts behind Debian's root-only wrappers
    elif found=$(command -v rabbitmq-server); then
        dirname "$found"
    else
        return 1
    fi
}

rabbit_home() {
    if is_root; then getent passwd rabbitmq | cut -d: -f6; else printf '%s\n' "$HOME"; fi
}
private_rabbit_port() { sed -n 's/^RABBITMQ_NODE_PORT=//p' "$dir/rabbitmq/node.env" 2> /dev/null; }
# The node's process: a beam that boots rabbit (rabbitmqctl is a beam too) and whose environment
# names our node (its command line does not).
rabbit_beam() {
    local pid
    for pid in $(pgrep -x beam.smp); do
        if tr '\0' ' ' 2> /dev/null < "/proc/$pid/cmdline" | grep -q -- "-s rabbit boot" &&
            tr '\0' '\n' 2> /dev/null < "/proc/$pid/environ" |
            grep -qx "RABBITMQ_NODENAME=$node"; then
            printf '%s\n' "$pid"
            return 0
        fi
    done
    return 1
}
rabbit_running() { rabbit_beam > /dev/null; }

new_rabbit() {
    local d=$dir/rabbitmq amqp dist
    own_dir "$d" rabbitmq RabbitMQ || return 1
    free_port amqp && free_port dist || return 1
    printf '[].\n' > "$d/enabled_plugins"
    # Its own file: the machine's rabbitmq.conf may pin the listener to the shared port.
    printf 'listeners.tcp.local = 127.0.0.1:%s\n' "$amqp" > "$d/rabbitmq.conf"
    mkdir -p "$d/conf.d"
    # The largest message it takes, as the compose brokers (see the file).
    cp "$repo/deploy/compose/rabbitmq.conf" "$d/conf.d/10-saga.conf"
    cat > "$d/node.env" <<- EOF
		RABBITMQ_NODENAME=$node
		RABBITMQ_NODE_PORT=$amqp
		RABBITMQ_DIST_PORT=$dist
		RABBITMQ_MNESIA_BASE=$d/mnesia
		RABBITMQ_LOG_BASE=$d/log
		RABBITMQ_PID_FILE=$d/pid
		RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins
		RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf
		RABBITMQ_CONFIG_FILES=$d/conf.d
		RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config
	EOF
    if is_root; then chown -R rabbitmq: "$d"; fi
}

# While it boots, the node is a beam process already; none (after a moment to appear) means it
# died, and its log says why.
# shellcheck disable=SC2329 # wait_port calls it
rabbit_booting() { rabbit_running || [ $((SECONDS - launched)) -lt 5 ]; }

private_rabbit() { # NOTE: what was done before, for the line
    local d=$dir/rabbitmq bin amqp what started=$SECONDS launched=$SECONDS
    if ! bin=$(rabbit_bin); then
        fail "RabbitMQ: the private node in $(shown "$d") needs rabbitmq-server, no longer" \
            "installed"
        return 0
    fi
    if [ ! -f "$d/node.env" ]; then
        new_rabbit || return 0
        what="started a private node"
    elif rabbit_running; then
        what="reused the private node"
    else
        what="started again, from its data, the private node"
    fi
    amqp=$(private_rabbit_port)
    if ! rabbit_running; then
        if reachable 127.0.0.1 "$amqp"; then
            fail "RabbitMQ: port $amqp of the private node in $(shown "$d") is taken by another" \
                "program: stop it, or remove $(shown "$d") for new ports"
            return 0
        fi
        local vars
        mapfile -t vars < "$d/node.env"
        launched=$SECONDS
        (cd "$d" && as_owner rabbitmq env HOME="$(rabbit_home)" "${vars[@]}" \
            "$bin/rabbitmq-server" -detached > "$d/startup.log" 2>&1 < /dev/null 9>&-)
    fi
    # The node answers ping before its AMQP listener is up: wait for the port itself.
    if ! wait_port "$amqp" 120 rabbit_booting; then
        fail "RabbitMQ: the private node in $(shown "$d") did not open port $amqp: see" \
            "$(shown "$d")/log and startup.log"
        return 0
    fi
    local took=" in $((SECONDS - started)) s"
    if [ "$what" = "reused the private node" ]; then took=""; fi
    say "RabbitMQ: ${1}${what} $node on 127.0.0.1:$amqp$took ($(shown "$d")); stop it with:" \
        "scripts/services.sh stop"
    local url="amqp://guest:guest@127.0.0.1:$amqp${path:-/}"
    env_lines+=("SAGA_AMQP_URL=$url" "SAGA_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:$amqp/"
        "RABBITMQ_NODENAME=$node") # rabbitmqctl (`saga setup`, the tests) then talks to this node
}

machine_rabbit() { # start this machine's own node, when it is ours to start
    if [ "$port" != 5672 ] || ! is_root || ! command -v rabbitmq-server > /dev/null; then
        return 1
    fi
    # Up, but listening elsewhere: not the broker the URL names.
    if env -u RABBITMQ_NODENAME rabbitmqctl -q ping > /dev/null 2>&1; then return 1; fi
    env -u RABBITMQ_NODENAME rabbitmq-server -detached > /dev/null 2>&1 < /dev/null 9>&- || return 1
    wait_port 5672 120 || return 1
    say "RabbitMQ: ${1}started this machine's node (rabbitmq-server -detached) on" \
        "127.0.0.1:5672; stop it with: rabbitmqctl stop"
}

broker() { # NOTE
    local url=${SAGA_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/} scheme host port path
    if ! split_url "$url"; then
        fail "RabbitMQ: SAGA_AMQP_URL is not a URL: write amqp://user:password@host:port/vhost"
        return 0
    fi
    if is_local "$host" && [ "$port" = "$(private_rabbit_port)" ]; then
        private_rabbit "$1"
    elif reachable "$host" "$port"; then
        say "RabbitMQ: ${1}$host:$port answers ($(named_by SAGA_AMQP_URL)): used as it is," \
            "nothing started"
    elif ! is_local "$host"; then
        fail "RabbitMQ: nothing answers at $host:$port (SAGA_AMQP_URL), another machine: start" \
            "it there, or unset SAGA_AMQP_URL for one here"
    elif machine_rabbit "$1"; then
        :
    elif rabbit_bin > /dev/null; then
        private_rabbit "$1"
    elif [ -z "$1" ] && apt_install rabbitmq-server; then
        broker "installed rabbitmq-server with apt-get, then "
    elif docker_ready; then
        if ! docker_up rabbitmq; then
            fail "RabbitMQ: docker compose up failed or its container is not healthy: see" \
                "$(shown "$dir")/docker-rabbitmq.log"
        else
            local amqp management
            amqp=$(compose_port 5672) management=$(compose_port 15672)
            say "RabbitMQ: ${1}a container is up (rabbitmq:3.13-management, docker compose" \
                "project $project) on 127.0.0.1:$amqp; stop it with: scripts/services.sh stop"
            # No rabbitmqctl here: `saga setup` gives the broker its users through the API.
            env_lines+=("SAGA_AMQP_URL=amqp://guest:guest@127.0.0.1:$amqp${path:-/}"
                "SAGA_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:$amqp/"
                "SAGA_SETUP_BROKER=http"
                "SAGA_BROKER_ADMIN_URL=http://guest:guest@127.0.0.1:$management")
        fi
    else
        fail "RabbitMQ: nothing answers at $host:$port and it is not installed: install" \
            "rabbitmq-server (as root, this script does it with apt-get) or a Docker engine" \
            "with compose"
    fi
}

# --- PostgreSQL ----------------------------------------------------------------------------------

pg_bin() {
    local found
    if found=$(command -v initdb) && found=$(dirname "$(realpath "$found")") &&
        [ -x "$found/pg_ctl" ]; then
        printf '%s\n' "$found"
        return 0
    fi
    # The newest first.
    for found in $(printf '%s\n' "${pg_globs[@]}" | sort -rV); do
        if [ -x "$found/initdb" ] && [ -x "$found/pg_ctl" ]; then
            printf '%s\n' "$found"
            return 0
        fi
    done
    return 1
}
pg_data=$dir/postgres/data
private_pg_port() {
    sed -n "s/^port = \([0-9]*\).*/\1/p" "$pg_data/postgresql.conf" 2> /dev/null | tail -n 1
}
private_pg_ctl() { as_owner postgres "$(pg_bin_of_data)/pg_ctl" -D "$pg_data" "$@"; }
private_pg_running() { (cd "$dir/postgres" && private_pg_ctl status > /dev/null 2>&1); }
# The binaries of the data's major version, when several are installed.
pg_bin_of_data() {
    local version
    version=$(cat "$pg_data/PG_VERSION" 2> /dev/null || true)
    if [ -n "$version" ] && [ -x "/usr/lib/postgresql/$version/bin/pg_ctl" ]; then
        printf '%s\n' "/usr/lib/postgresql/$version/bin"
    else
        pg_bin
    fi
}

new_pg() {
    local d=$dir/postgres database
    own_dir "$d" postgres PostgreSQL || return 1
    chmod 700 "$d"
    free_port database || return 1
    if ! (cd "$d" && as_owner postgres "$(pg_bin)/initdb" -D "$pg_data" -A trust -U postgres \
        -E UTF8 --locale=C > "$d/initdb.log" 2>&1); then
        fail "PostgreSQL: initdb failed: see $(shown "$d")/initdb.log"
        return 1
    fi
    # TCP only: a socket path under a deep project directory can pass the 107-byte limit.
    cat >> "$pg_data/postgresql.conf" <<- EOF
		# scripts/services.sh: a private instance
		port = $database
		listen_addresses = '127.0.0.1'
		unix_socket_directories = ''
	EOF
}

private_pg() { # NOTE
    local d=$dir/postgres what started=$SECONDS database
    if [ ! -f "$pg_data/PG_VERSION" ]; then
        new_pg || return 0
        what="started a private instance"
    elif private_pg_running; then
        what="reused the private instance"
    else
        what="started again, from its data, the private instance"
    fi
    database=$(private_pg_port)
    if ! private_pg_running; then
        if reachable 127.0.0.1 "$database"; then
            fail "PostgreSQL: port $database of the private instance in $(shown "$d") is taken" \
                "by another program: stop it, or remove $(shown "$d") for a new port"
            return 0
        fi
        if ! (cd "$d" && private_pg_ctl -l "$d/log" -w -t 60 -s start \
            > /dev/null 2>&1 < /dev/null 9>&-); then
            fail "PostgreSQL: the private instance in $(shown "$d") did not start: see" \
                "$(shown "$d")/log"
            return 0
        fi
    fi
    local took=" in $((SECONDS - started)) s"
    if [ "$what" = "reused the private instance" ]; then took=""; fi
    say "PostgreSQL: ${1}${what} on 127.0.0.1:$database$took ($(shown "$d")); stop it with:" \
        "scripts/services.sh stop"
    env_lines+=("SAGA_DATABASE_URL=postgresql://postgres@127.0.0.1:$database${path:-/saga}"
        "SAGA_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:$database/")
}

machine_pg() { # start this machine's own cluster, when it is ours to start
    if [ "$port" != 5432 ] || ! is_root || ! command -v pg_lsclusters > /dev/null; then return 1; fi
    local cluster
    cluster=$(pg_lsclusters -h 2> /dev/null | awk '$3 == 5432 && $4 == "down" {print $1, $2; exit}')
    if [ -z "$cluster" ]; then return 1; fi
    # shellcheck disable=SC2086 # "VERSION NAME"
    pg_ctlcluster --skip-systemctl-redirect $cluster start > /dev/null 2>&1 9>&- || return 1
    wait_port "$port" 60 || return 1
    say "PostgreSQL: ${1}started this machine's cluster ${cluster/ //} on 127.0.0.1:$port; stop" \
        "it with: pg_ctlcluster ${cluster} stop"
}

database() { # NOTE
    local url=${SAGA_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/saga} scheme host port path
    if ! split_url "$url"; then
        fail "PostgreSQL: SAGA_DATABASE_URL is not a URL: write" \
            "postgresql://user@host:port/database"
        return 0
    fi
    if is_local "$host" && [ "$port" = "$(private_pg_port)" ]; then
        private_pg "$1"
    elif reachable "$host" "$port"; then
        say "PostgreSQL: ${1}$host:$port answers ($(named_by SAGA_DATABASE_URL)): used as it" \
            "is, nothing started"
    elif ! is_local "$host"; then
        fail "PostgreSQL: nothing answers at $host:$port (SAGA_DATABASE_URL), another machine:" \
            "start it there, or unset SAGA_DATABASE_URL for one here"
    elif machine_pg "$1"; then
        :
    elif pg_bin > /dev/null; then
        private_pg "$1"
    elif [ -z "$1" ] && apt_install postgresql; then
        database "installed postgresql with apt-get, then "
    elif docker_ready; then
        if ! docker_up postgres; then
            fail "PostgreSQL: docker compose up failed or its container is not healthy: see" \
                "$(shown "$dir")/docker-postgres.log"
        else
            local database
            database=$(compose_port 5432)
            say "PostgreSQL: ${1}a container is up (postgres:15, docker compose project" \
                "$project) on 127.0.0.1:$database; stop it with: scripts/services.sh stop"
            env_lines+=("SAGA_DATABASE_URL=postgresql://postgres@127.0.0.1:$database${path:-/saga}"
                "SAGA_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:$database/")
        fi
    else
        fail "PostgreSQL: nothing answers at $host:$port and it is not installed: install" \
            "postgresql (as root, this script does it with apt-get) or a Docker engine with" \
            "compose"
    fi
}

# --- stop ----------------------------------------------------------------------------------------

stop() {
    local pid stopped=0
    if pid=$(rabbit_beam); then
        kill -TERM "$pid" # the node shuts down cleanly on SIGTERM
        for _ in $(seq 1 300); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            fail "RabbitMQ: the private node $node (pid $pid) is still running after 30 s"
        else
            say "RabbitMQ: stopped the private node $node (its data kept in" \
                "$(shown "$dir/rabbitmq"))"
        fi
        stopped=1
    fi
    if [ -f "$pg_data/PG_VERSION" ] && private_pg_running; then
        if (cd "$dir/postgres" && private_pg_ctl -m fast -w -t 60 -s stop > /dev/null 2>&1); then
            say "PostgreSQL: stopped the private instance (its data kept in" \
                "$(shown "$dir/postgres"))"
        else
            fail "PostgreSQL: the private instance in $(shown "$dir/postgres") did not stop:" \
                "see its log"
        fi
        stopped=1
    fi
    if [ -f "$compose_file" ] && docker_ready && [ -n "$(compose ps -q 2> /dev/null)" ]; then
        compose stop > /dev/null 2>&1 && say "stopped the containers of docker compose project" \
            "$project (their volumes kept)"
        stopped=1
    fi
    if [ "$stopped" = 0 ]; then say "no private instance of $(shown "$dir") is running"; fi
}

# --- main ----------------------------------------------------------------------------------------

case "${1:-start}" in
    start)
        broker ""
        database ""
        {
            say "# Written by scripts/services.sh: the private instances in use (none when empty)."
            if [ "${#env_lines[@]}" -gt 0 ]; then printf 'export %q\n' "${env_lines[@]}"; fi
        } > "$env_file.new"
        mv "$env_file.new" "$env_file"
        ;;
    stop) stop ;;
    *)
        say "usage: scripts/services.sh [start|stop]" >&2
        exit 2
        ;;
esac
exit "$failed"
