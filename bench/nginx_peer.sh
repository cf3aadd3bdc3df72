# Sourced by the bench scripts: nginx (nginx-light) with WebDAV PUT on an ephemeral loopback
# port, serving $work/www, what a user would run instead of ckptd to keep raw files.
# start_nginx sets nginx_pid and nginx_url; the caller stops it (kill "$nginx_pid").
start_nginx() {
  mkdir -p "$work/www" "$work/nginx"
  # Port 0 is not allowed in nginx's listen: pick a free port from the kernel.
  local port
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  cat > "$work/nginx/nginx.conf" <<NGINX
daemon off;
user root;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  client_max_body_size 0;
  sendfile on;
  server {
    listen 127.0.0.1:$port;
    root $work/www;
    dav_methods PUT;
    create_full_put_path on;
  }
}
NGINX
  nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" &
  nginx_pid=$!
  local up=""
  for _ in $(seq 500); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && { up=1; break; }
    sleep 0.01
  done
  if [[ -z "$up" ]]; then
    echo "nginx did not start (scripts/install-deps.sh --bench installs nginx-light)" >&2
    exit 1
  fi
  nginx_url="http://127.0.0.1:$port"
}
