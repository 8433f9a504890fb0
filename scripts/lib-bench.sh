# Shared by the benchmark scripts that run relay-server beside an nginx anchor
# (bench-relay.sh, bench-pipeline.sh, bench-postgres.sh). Source it after setting WORK (a temp
# dir the caller removes) and PIDS=() (killed by the caller's EXIT trap).

# An unused loopback port.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# Waits up to 60 s for a URL to answer 2xx; the benchmark cannot go on without it.
wait_url() {
  for _ in $(seq 1 2400); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.025; done
  echo "$(basename "$0"): $1 never came up" >&2
  exit 1
}

# The anchor: nginx answering a tiny JSON body with `return 200`, two workers (one per core),
# on a free port. Sets NGINX_PORT and NGINX_PID.
start_nginx_anchor() {
  NGINX_PORT=$(free_port)
  mkdir -p "$WORK/nginx"
  cat > "$WORK/nginx/nginx.conf" <<CONF
worker_processes 2;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx; proxy_temp_path $WORK/nginx; fastcgi_temp_path $WORK/nginx;
  uwsgi_temp_path $WORK/nginx; scgi_temp_path $WORK/nginx;
  server { listen 127.0.0.1:$NGINX_PORT; location / { default_type application/json; return 200 '{"ok":true}'; } }
}
CONF
  nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" 2>/dev/null &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  wait_url "http://127.0.0.1:$NGINX_PORT/"
}

stop_nginx_anchor() { kill -TERM "$NGINX_PID" 2>/dev/null || true; wait "$NGINX_PID" 2>/dev/null || true; }
