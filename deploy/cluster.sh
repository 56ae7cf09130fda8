#!/usr/bin/env bash
# A whole "beyond one machine" configuration on 127.0.0.1, for tests and demos:
#   - a Spark standalone master and UPSERT_CLUSTER_WORKERS workers (default 2; from the
#     venv's pyspark package), each offering cores and memory of its own,
#   - a long-lived Spark Connect server, an application on that master: every
#     `upsertctl ingest` and every Dagster run attaches to it (SPARK_REMOTE) in about a
#     second instead of starting a driver JVM and executors of its own (9-13 s),
#   - a moto S3 server with one bucket (the blob store and an S3 landing area),
#   - a PostgreSQL database for consensus AND Dagster's run storage (dagster-postgres).
#
# Usage: deploy/cluster.sh start [--workers N]|stop|status|env
#   eval "$(deploy/cluster.sh env)"   # exports SPARK_REMOTE, SPARK_MASTER, UPSERT_*, AWS_*, DAGSTER_HOME
#
# Invariants:
#   - Everything listens on 127.0.0.1 only, on free ports chosen at start.
#   - State (logs, pids, env file, DAGSTER_HOME, Spark work dir) lives under
#     $UPSERT_CLUSTER_DIR (default ./.cluster); `start` is refused while it is running.
#   - Every process is started in a session of its own; `stop` signals those process
#     groups (TERM, then KILL) and nothing else. The database is kept (data, not a process).
#   - `start` returns only when each service answers (or fails, printing its log tail).
#   - The Connect server holds UPSERT_CLUSTER_CORES cores for good (spark.cores.max, its
#     executors stay up between ingests) as one executor per worker of CORES / WORKERS
#     cores (spark.executor.cores) and UPSERT_CLUSTER_MEMORY: a file's tasks can run on
#     WORKERS executors. Each worker offers twice that executor: the other half is for
#     applications submitted to the master directly (SPARK_REMOTE unset: SPARK_MASTER),
#     which would otherwise wait forever for a free core.
#   - The Connect server's application UI listens on 127.0.0.1 (UPSERT_CLUSTER_SPARK_UI;
#     its REST API, /api/v1, says which executor ran each task), the master's too
#     (UPSERT_CLUSTER_MASTER_UI; /json lists the workers).
#   - `start` writes the names of the services it starts to $DIR/services; `stop` and
#     `status` act on those (whatever WORKERS says then).
#   - The Connect server's executors import this checkout (spark.executorEnv.PYTHONPATH,
#     the repo first) with UPSERT_PYTHON; its gRPC port listens on 127.0.0.1 only.
# Settings: UPSERT_PYTHON (default: the repo's .venv, else python3),
#   UPSERT_CLUSTER_PG (default postgresql://postgres@127.0.0.1:5432),
#   UPSERT_CLUSTER_DB (default upsert_cluster), UPSERT_CLUSTER_BUCKET (default upsert),
#   UPSERT_CLUSTER_CORES (default 2, a multiple of the workers), UPSERT_CLUSTER_MEMORY
#   (default 1g, per executor), UPSERT_CLUSTER_WORKERS (default 2; `start --workers N`).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORKERS="${UPSERT_CLUSTER_WORKERS:-2}"
if [[ "${1:-}" == start && "${2:-}" == --workers ]]; then WORKERS="${3:-}"
elif [[ "${1:-}" == start && "${2:-}" == --workers=* ]]; then WORKERS="${2#--workers=}"
elif [[ "${1:-}" == start && -n "${2:-}" ]]; then
  echo "cluster.sh: usage: $0 start [--workers N]" >&2; exit 2
fi
DIR="${UPSERT_CLUSTER_DIR:-./.cluster}"
[[ "${1:-}" == start ]] && mkdir -p "$DIR"
[[ -d "$DIR" ]] && DIR="$(cd "$DIR" && pwd)"
PG="${UPSERT_CLUSTER_PG:-postgresql://postgres@127.0.0.1:5432}"
DB="${UPSERT_CLUSTER_DB:-upsert_cluster}"
BUCKET="${UPSERT_CLUSTER_BUCKET:-upsert}"
CORES="${UPSERT_CLUSTER_CORES:-2}"
MEMORY="${UPSERT_CLUSTER_MEMORY:-1g}"
if [[ -n "${UPSERT_PYTHON:-}" ]]; then PY="$UPSERT_PYTHON"
elif [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"
else PY="$(command -v python3)"; fi
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: workers must be a positive integer, got '$WORKERS'" >&2; exit 2; }
# The services of a running cluster are those its `start` wrote down.
if [[ -f "$DIR/services" && "${1:-}" != start ]]; then
  mapfile -t SERVICES < "$DIR/services"
else
  SERVICES=(spark-master)
  for ((i = 1; i <= WORKERS; i++)); do SERVICES+=("spark-worker-$i"); done
  SERVICES+=(spark-connect moto)
fi
CONNECT_CLASS=org.apache.spark.sql.connect.service.SparkConnectServer

die() { echo "cluster.sh: $*" >&2; exit 1; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() { local f="$DIR/$1.pid"; [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null; }

# launch NAME CMD...: start CMD in a new session (its pid is its process group id).
launch() {
  local name="$1"; shift
  setsid "$@" >"$DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
}

# wait_for NAME TIMEOUT_S CHECK...: poll CHECK until it succeeds; fail with the log tail.
wait_for() {
  local name="$1" timeout="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ! alive "$name" || (( SECONDS >= deadline )); then
      echo "cluster.sh: $name did not come up; last lines of $DIR/$name.log:" >&2
      tail -n 30 "$DIR/$name.log" >&2 || true
      do_stop >/dev/null 2>&1 || true
      exit 1
    fi
    sleep 0.3
  done
}

port_open() { "$PY" -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()' "$1"; }
http_ok() { "$PY" -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1"; }
log_has() { grep -q "$2" "$DIR/$1.log"; }

do_start() {
  local running=("${SERVICES[@]}")
  [[ -f "$DIR/services" ]] && mapfile -t -O "${#running[@]}" running < "$DIR/services"
  for s in "${running[@]}"; do alive "$s" && die "already running ($s); run stop first"; done
  # A client setting is not ours: with SPARK_REMOTE in the environment (exported for
  # upsertctl, or left by an earlier `eval "$(deploy/cluster.sh env)"`), spark-submit
  # refuses to start the Connect server ("Remote cannot be specified with master").
  unset SPARK_REMOTE
  local spark_home; spark_home="$("$PY" -c 'import os,pyspark; print(os.path.dirname(pyspark.__file__))')"
  (( CORES % WORKERS == 0 )) || die "UPSERT_CLUSTER_CORES ($CORES) must be a multiple of the workers ($WORKERS)"
  local executor_cores=$((CORES / WORKERS))
  local master_port master_ui moto_port connect_port connect_ui
  master_port="$(free_port)"; master_ui="$(free_port)"; moto_port="$(free_port)"
  connect_port="$(free_port)"; connect_ui="$(free_port)"
  local memory_mb
  case "$MEMORY" in
    *[gG]) memory_mb=$(( ${MEMORY%[gG]} * 1024 )) ;;
    *[mM]) memory_mb=${MEMORY%[mM]} ;;
    *) die "UPSERT_CLUSTER_MEMORY must be like 1g or 512m, got $MEMORY" ;;
  esac
  local pythonpath="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  export SPARK_LOCAL_IP=127.0.0.1 SPARK_MASTER_HOST=127.0.0.1 SPARK_HOME="$spark_home"
  export SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"
  export PYSPARK_PYTHON="$PY" SPARK_LOG_DIR="$DIR" SPARK_WORKER_DIR="$DIR/spark-work"
  mkdir -p "$SPARK_WORKER_DIR" "$DIR/dagster"
  printf '%s\n' "${SERVICES[@]}" > "$DIR/services"

  # PostgreSQL: one database for consensus and Dagster (created once, kept across runs).
  psql "$PG/postgres" -tAc "SELECT 1" >/dev/null || die "PostgreSQL does not answer at $PG"
  if [[ -z "$(psql "$PG/postgres" -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]]; then
    createdb -d "$PG/postgres" "$DB" 2>/dev/null || psql "$PG/postgres" -qc "CREATE DATABASE \"$DB\""
  fi

  launch spark-master "$spark_home/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$master_port" --webui-port "$master_ui"
  launch moto "$(dirname "$PY")/moto_server" -H 127.0.0.1 -p "$moto_port"
  wait_for spark-master 60 log_has spark-master "I have been elected leader"
  local i
  for ((i = 1; i <= WORKERS; i++)); do
    launch "spark-worker-$i" "$spark_home/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --host 127.0.0.1 --webui-port "$(free_port)" --cores "$((executor_cores * 2))" \
      --memory "$((memory_mb * 2))m" --work-dir "$SPARK_WORKER_DIR" "spark://127.0.0.1:$master_port"
  done
  wait_for moto 30 http_ok "http://127.0.0.1:$moto_port/moto-api/"
  AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
    "$PY" -c 'import sys,boto3; boto3.client("s3", endpoint_url=sys.argv[1]).create_bucket(Bucket=sys.argv[2])' \
    "http://127.0.0.1:$moto_port" "$BUCKET"
  for ((i = 1; i <= WORKERS; i++)); do
    wait_for "spark-worker-$i" 60 log_has "spark-worker-$i" "Successfully registered with master"
  done

  # Spark Connect, in the foreground of its own session (so `stop` ends it like the rest).
  # The server plans `spark.read.format("upsert")` reads and ships its S3 settings to
  # the executors with each task (resources/task_env.py), so it gets the same stores
  # and credentials as the clients (a production server would use its own role).
  local pg_sa="${PG/postgresql:\/\//postgresql+psycopg://}/$DB"
  launch spark-connect env PYTHONPATH="$pythonpath" \
    AWS_ENDPOINT_URL="http://127.0.0.1:$moto_port" AWS_ACCESS_KEY_ID=testing \
    AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
    UPSERT_CONSENSUS_URL="$pg_sa" UPSERT_BLOB_URL="s3://$BUCKET/shards" \
    "$spark_home/bin/spark-submit" \
    --class "$CONNECT_CLASS" --name "upsert Spark Connect" \
    --master "spark://127.0.0.1:$master_port" \
    --conf spark.connect.grpc.binding.address=127.0.0.1 \
    --conf "spark.connect.grpc.binding.port=$connect_port" \
    --conf spark.ui.enabled=true --conf "spark.ui.port=$connect_ui" \
    --conf spark.ui.showConsoleProgress=false \
    --conf "spark.cores.max=$CORES" --conf "spark.executor.cores=$executor_cores" \
    --conf "spark.executor.memory=${memory_mb}m" \
    --conf "spark.executorEnv.PYTHONPATH=$pythonpath" \
    --conf "spark.executorEnv.PYSPARK_PYTHON=$PY" --conf "spark.pyspark.python=$PY" \
    --conf spark.sql.shuffle.partitions=8
  wait_for spark-connect 120 port_open "$connect_port"
  wait_for spark-connect 30 http_ok "http://127.0.0.1:$connect_ui/api/v1/applications"

  cp "$REPO/deploy/dagster.yaml" "$DIR/dagster/dagster.yaml"
  cat > "$DIR/env.sh" <<ENV
export SPARK_REMOTE=sc://127.0.0.1:$connect_port
export SPARK_MASTER=spark://127.0.0.1:$master_port
export UPSERT_CLUSTER_MASTER_UI=http://127.0.0.1:$master_ui
export UPSERT_CLUSTER_SPARK_UI=http://127.0.0.1:$connect_ui
export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON=$PY
export UPSERT_CONSENSUS_URL=$pg_sa
export UPSERT_BLOB_URL=s3://$BUCKET/shards
export UPSERT_CLUSTER_LANDING=s3://$BUCKET/landing
export AWS_ENDPOINT_URL=http://127.0.0.1:$moto_port
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_DEFAULT_REGION=us-east-1
export DAGSTER_HOME=$DIR/dagster
export DAGSTER_PG_URL=$PG/$DB
ENV
  echo "cluster up: master spark://127.0.0.1:$master_port (UI :$master_ui), $WORKERS worker(s)," \
    "Spark Connect sc://127.0.0.1:$connect_port (UI :$connect_ui), moto :$moto_port, db $DB"
  echo "  eval \"\$($0 env)\"  # to use it"
}

do_stop() {
  local s pid
  for s in "${SERVICES[@]}"; do
    [[ -f "$DIR/$s.pid" ]] || continue
    pid="$(cat "$DIR/$s.pid")"
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for s in "${SERVICES[@]}"; do
    [[ -f "$DIR/$s.pid" ]] || continue
    pid="$(cat "$DIR/$s.pid")"
    for _ in $(seq 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$DIR/$s.pid"
    echo "stopped $s"
  done
  rm -f "$DIR/env.sh"
}

do_status() {
  local s rc=0
  for s in "${SERVICES[@]}"; do
    if alive "$s"; then echo "$s: running (pid $(cat "$DIR/$s.pid"))"; else echo "$s: stopped"; rc=3; fi
  done
  return $rc
}

case "${1:-}" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  env) [[ -f "$DIR/env.sh" ]] || die "not running (no $DIR/env.sh); run start first"; cat "$DIR/env.sh" ;;
  *) die "usage: $0 start [--workers N]|stop|status|env" ;;
esac
