//! `POST /api/pull`: a model from the Hugging Face hub, pulled as `coli pull` pulls it
//! (the puller `coli serve` installs: crate::commands::pull, which this layer may not
//! import), with Ollama's progress lines: `{"status": "pulling OWNER/NAME"}`, then for each
//! file `{"status": "pulling FILE", "digest": "sha256:...", "total": N, "completed": M}`
//! (at most about four a second per file, and always its last), then
//! `{"status": "success"}`; an error is a last line `{"error": "..."}`. With
//! `"stream": false`, the last object alone. A model already installed answers success
//! at once (Ollama's pull would check for a newer version; `coli pull --force` replaces one).
//!
//! The name is a hub repository, `OWNER/NAME[@REVISION]`, or as Ollama names one,
//! `hf.co/OWNER/NAME[:TAG]`, where a TAG other than `latest` picks the GGUF file of a GGUF
//! repository (`coli pull --gguf TAG`).

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::super::openai::stream::async_stream_of;
use super::super::AppState;
use super::{line, model_name, ndjson, parse_object, Error};
use crate::hub::{Progress, RemoteFile};

/// Pulls `repo` (`OWNER/NAME[@REV]`), the GGUF file named by the second argument of a GGUF
/// repository, into the models directory, telling the progress of each download; the
/// installed id.
pub type Puller = Arc<dyn Fn(&str, Option<String>, &Path, Progress) -> anyhow::Result<String> + Send + Sync>;

/// Pulls running now, by repository: a second pull of one waits for nothing, it is refused.
static RUNNING: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// A place in [`RUNNING`]; dropping it leaves.
struct Running(String);

impl Running {
    fn take(repo: &str) -> Option<Running> {
        let mut g = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert_with(HashSet::new).insert(repo.to_string()).then(|| Running(repo.to_string()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut g = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = g.as_mut() {
            set.remove(&self.0);
        }
    }
}

/// `hf.co/OWNER/NAME:TAG` -> (`OWNER/NAME`, the GGUF file `TAG`); `OWNER/NAME@REV` as it is.
fn hub_name(name: &str) -> (String, Option<String>) {
    let name = name.trim();
    let name = name.strip_prefix("hf.co/").or_else(|| name.strip_prefix("huggingface.co/")).unwrap_or(name);
    match name.split_once(':') {
        Some((repo, "latest")) => (repo.to_string(), None),
        Some((repo, tag)) => (repo.to_string(), Some(tag.to_string())),
        None => (name.to_string(), None),
    }
}

pub async fn pull(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let req = match parse_object(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let name = match model_name(&req) {
        Ok(n) => n,
        Err(e) => return e.into_response(),
    };
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(true);
    let (repo, gguf) = hub_name(&name);
    let id = repo.split_once('@').map_or(repo.as_str(), |(r, _)| r).to_string();
    let installed = state.registry.get(&id).is_some();
    let (Some(puller), Some(models)) =
        (state.puller.get().cloned(), state.registry.models_dir().map(Path::to_path_buf))
    else {
        if installed {
            return done(stream, vec![json!({"status": "success"})]);
        }
        return Error::bad("this helper cannot pull models (no models directory, or not started by coli serve)")
            .into_response();
    };
    if installed {
        return done(stream, vec![json!({"status": "success"})]);
    }
    let Some(running) = Running::take(&id) else {
        return Error { status: StatusCode::CONFLICT, message: format!("{id} is being pulled already") }
            .into_response();
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    let _ = tx.send(json!({"status": format!("pulling {repo}")}));
    let sent: Arc<Mutex<Option<(String, Instant)>>> = Arc::new(Mutex::new(None));
    let progress_tx = tx.clone();
    let progress: Progress = Arc::new(move |f: &RemoteFile, completed: u64| {
        // At most about four lines a second, and always a file's first and last.
        let mut last = sent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let due = match last.as_ref() {
            Some((path, at)) => path != &f.path || now - *at >= Duration::from_millis(250),
            None => true,
        };
        if due || completed >= f.size {
            *last = Some((f.path.clone(), now));
            let mut v = json!({"status": format!("pulling {}", f.path), "total": f.size, "completed": completed});
            if let Some(sha) = &f.sha256 {
                v["digest"] = json!(format!("sha256:{sha}"));
            }
            let _ = progress_tx.send(v);
        }
    });
    tokio::task::spawn_blocking(move || {
        let _running = running;
        let last = match puller(&repo, gguf, &models, progress) {
            Ok(_) => json!({"status": "success"}),
            Err(e) => json!({"error": format!("{e:#}")}),
        };
        let _ = tx.send(last);
    });
    if !stream {
        let mut last = json!({"error": "the pull stopped before it finished"});
        while let Some(v) = rx.recv().await {
            last = v;
        }
        return match last.get("error") {
            Some(_) => (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(last)).into_response(),
            None => axum::Json(last).into_response(),
        };
    }
    ndjson(async_stream_of(move |out| async move {
        while let Some(v) = rx.recv().await {
            out.send(line(&v)).await?;
        }
        Some(())
    }))
}

/// An answer known at once: these lines streamed, or the last alone.
fn done(stream: bool, lines: Vec<Value>) -> Response {
    if !stream {
        return axum::Json(lines.last().cloned().unwrap_or(Value::Null)).into_response();
    }
    let body: String = lines.iter().map(|v| format!("{v}\n")).collect();
    ndjson(axum::body::Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_names_of_hub_repositories() {
        assert_eq!(hub_name("acme/tiny"), ("acme/tiny".into(), None));
        assert_eq!(hub_name("acme/tiny@v2"), ("acme/tiny@v2".into(), None));
        assert_eq!(hub_name("hf.co/acme/tiny:latest"), ("acme/tiny".into(), None));
        assert_eq!(hub_name("hf.co/acme/tiny-GGUF:Q4_K_M"), ("acme/tiny-GGUF".into(), Some("Q4_K_M".into())));
    }
}
