//! A tiny blocking HTTP/1.1 client over a plain TcpStream, for `coli bench-serve` and
//! the tests: keep-alive, Content-Length and chunked bodies, and raw requests (so tests
//! can send what no well-behaved client would).

// Parts of this client only the tests use.
#![cfg_attr(not(test), allow(dead_code))]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// (lower-case name, value) in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One keep-alive connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Conn { reader: BufReader::with_capacity(256 * 1024, s) })
    }

    pub fn stream(&mut self) -> &mut TcpStream {
        self.reader.get_mut()
    }

    /// Sends raw bytes as they are.
    pub fn send_raw(&mut self, raw: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(raw)
    }

    /// Sends a request with `Host: 127.0.0.1:PORT` unless `headers` has a Host, and a
    /// Content-Length when there is a body.
    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<()> {
        let port = self.reader.get_ref().peer_addr()?.port();
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
            req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
        }
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.send_raw(&bytes)
    }

    /// Reads the status line and headers.
    pub fn read_head(&mut self) -> std::io::Result<(u16, Vec<(String, String)>)> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(&line))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').ok_or_else(|| bad(l))?;
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        Ok((status, headers))
    }

    /// Reads one whole response; `head` says it answers a HEAD request (no body).
    pub fn read_response(&mut self, head: bool) -> std::io::Result<Response> {
        let (status, headers) = self.read_head()?;
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let mut body = Vec::new();
        if head || status == 204 || status == 304 || (100..200).contains(&status) {
        } else if get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
            while let Some(chunk) = self.read_chunk()? {
                body.extend_from_slice(&chunk);
            }
        } else if let Some(len) = get("content-length") {
            let len: usize = len.parse().map_err(|_| bad(&len))?;
            body.resize(len, 0);
            self.reader.read_exact(&mut body)?;
        } else {
            self.reader.read_to_end(&mut body)?;
        }
        Ok(Response { status, headers, body })
    }

    /// Reads the next chunk of a chunked body; None at the end.
    pub fn read_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16).map_err(|_| bad(&line))?;
        let mut chunk = vec![0u8; size];
        self.reader.read_exact(&mut chunk)?;
        let mut crlf = [0u8; 2];
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                if line.trim_end().is_empty() {
                    return Ok(None);
                }
            }
        }
        self.reader.read_exact(&mut crlf)?;
        Ok(Some(chunk))
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        self.send(method, path, headers, body)?;
        self.read_response(method == "HEAD")
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad HTTP response: {what:?}"))
}

/// One request on a fresh connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    Conn::open(addr)?.request(method, path, headers, body)
}
