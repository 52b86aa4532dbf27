//! The real peers a user would pick instead, on the same loopback backends: nginx and HAProxy as
//! reverse proxies with their passive health checking, configured as their documentation
//! recommends and without retries, and grpcio's C-core client with
//! `outlier_detection_experimental` (A50 at its defaults), driven by `grpcio_client.py`.
//! `install-peers.sh` installs them (Debian's nginx and haproxy, grpcio from PyPI).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::sample::{Sample, TIMEOUT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proxy {
    Nginx,
    Haproxy,
}

impl Proxy {
    pub fn name(self) -> &'static str {
        match self {
            Proxy::Nginx => "nginx (max_fails=3 fail_timeout=30s)",
            Proxy::Haproxy => "HAProxy (observe layer7, error-limit 10, mark-down)",
        }
    }

    fn binary(self) -> &'static str {
        match self {
            Proxy::Nginx => "/usr/sbin/nginx",
            Proxy::Haproxy => "/usr/sbin/haproxy",
        }
    }

    pub fn installed(self) -> bool {
        Path::new(self.binary()).exists()
    }

    /// Starts the proxy in front of `backends`, in a scratch directory of its own, and waits
    /// until it accepts connections.
    pub fn start(self, backends: &[SocketAddr]) -> std::io::Result<Running> {
        let dir = scratch_dir(match self {
            Proxy::Nginx => "nginx",
            Proxy::Haproxy => "haproxy",
        })?;
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let timeout = TIMEOUT.as_secs();
        let mut command = match self {
            Proxy::Nginx => {
                let servers: String = backends
                    .iter()
                    .map(|b| format!("    server {b} max_fails=3 fail_timeout=30s;\n"))
                    .collect();
                let d = dir.display();
                // One process (no master), so that killing the child stops the proxy. Failures
                // are counted for the statuses listed by proxy_next_upstream; one try means no
                // retry.
                let config = format!(
                    "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
                     error_log {d}/error.log error;\nevents {{ worker_connections 4096; }}\n\
                     http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  \
                     proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
                     uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
                     upstream backends {{\n{servers}    keepalive 64;\n  }}\n  server {{\n    \
                     listen {addr};\n    location / {{\n      proxy_pass http://backends;\n      \
                     proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      \
                     proxy_connect_timeout {timeout}s;\n      proxy_read_timeout {timeout}s;\n      \
                     proxy_send_timeout {timeout}s;\n      \
                     proxy_next_upstream error timeout http_500 http_502 http_503 http_504;\n      \
                     proxy_next_upstream_tries 1;\n    }}\n  }}\n}}\n"
                );
                std::fs::write(dir.join("nginx.conf"), config)?;
                let mut command = Command::new(self.binary());
                command
                    .arg("-p")
                    .arg(&dir)
                    .arg("-e")
                    .arg(dir.join("error.log"))
                    .arg("-c")
                    .arg(dir.join("nginx.conf"));
                command
            }
            Proxy::Haproxy => {
                let servers: String = backends
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        format!(
                            "  server s{i} {b} check observe layer7 error-limit 10 on-error mark-down\n"
                        )
                    })
                    .collect();
                let config = format!(
                    "global\n  nbthread 1\n  maxconn 4096\n\ndefaults\n  mode http\n  \
                     timeout connect {timeout}s\n  timeout client 30s\n  timeout server {timeout}s\n  \
                     timeout check {timeout}s\n  retries 0\n\nfrontend fe\n  bind {addr}\n  \
                     default_backend be\n\nbackend be\n  balance roundrobin\n{servers}"
                );
                std::fs::write(dir.join("haproxy.cfg"), config)?;
                let mut command = Command::new(self.binary());
                command.arg("-db").arg("-f").arg(dir.join("haproxy.cfg"));
                command
            }
        };
        let log = std::fs::File::create(dir.join("stderr.log"))?;
        let child = command.stdout(Stdio::null()).stderr(log).spawn()?;
        let running = Running { child, addr, dir };
        if let Err(error) = wait_listening(addr) {
            let log = std::fs::read_to_string(running.dir.join("stderr.log")).unwrap_or_default();
            return Err(std::io::Error::other(format!("{error}: {log}")));
        }
        Ok(running)
    }
}

/// A proxy process; killed when dropped.
pub struct Running {
    child: Child,
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scratch_dir(what: &str) -> std::io::Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tower-outlier-real-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(addr: SocketAddr) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::other(format!("nothing listens on {addr}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The grpcio client process for one cell: started, told to go, and read back at the end.
pub struct Grpcio {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Grpcio {
    pub fn installed() -> bool {
        Command::new("python3")
            .args(["-c", "import grpc"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts the client over `backends` with its channel connected, ready to send.
    pub fn start(
        backends: &[SocketAddr],
        shape: &str,
        rate: f64,
        callers: usize,
        duration: f64,
    ) -> std::io::Result<Grpcio> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("real_sockets/grpcio_client.py");
        let targets: Vec<String> = backends.iter().map(|b| b.to_string()).collect();
        let mut child = Command::new("python3")
            .arg(script)
            .args(["--targets", &targets.join(",")])
            .args(["--shape", shape])
            .args(["--rate", &rate.to_string()])
            .args(["--callers", &callers.to_string()])
            .args(["--duration", &duration.to_string()])
            .args(["--timeout", &TIMEOUT.as_secs_f64().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(std::io::Error::other(format!(
                "grpcio client did not start: {line:?}"
            )));
        }
        Ok(Grpcio {
            child,
            stdin,
            stdout,
        })
    }

    /// Starts the traffic.
    pub fn go(&mut self) -> std::io::Result<()> {
        self.stdin.write_all(b"go\n")?;
        self.stdin.flush()
    }

    /// Waits for the client to finish and returns its requests.
    pub fn finish(mut self) -> std::io::Result<Vec<Sample>> {
        let mut samples = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                break;
            }
            let mut fields = line.split_whitespace();
            let (Some(_start), Some(latency), Some(ok)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            samples.push(Sample {
                latency: latency.parse().map_err(std::io::Error::other)?,
                ok: ok == "1",
            });
        }
        let status = self.child.wait()?;
        if !status.success() {
            return Err(std::io::Error::other(format!("grpcio client: {status}")));
        }
        Ok(samples)
    }
}
