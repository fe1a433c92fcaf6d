//! Names the browser engine gives things it keeps: the persistent expert tier of a model.
//! Plain functions, tested natively.

/// The browser storage of the model at `base` with manifest `fingerprint`: its last path
/// segment (the helper's model id, or a hosted directory's name) as letters, digits, `.`,
/// `_` and `-`, then the fingerprint. The fingerprint is the checksum of colibri.json,
/// which holds the checksum of every expert: two hosts get the same name only for the
/// same model bytes, which they then share (every read is checked against its checksum).
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
pub fn storage_name(base: &str, fingerprint: &str) -> String {
    let last = base.split(['?', '#']).next().unwrap_or("").trim_end_matches('/').rsplit('/').next().unwrap_or("");
    let id: String =
        last.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    let id = id.trim_start_matches('.');
    format!("{}-{fingerprint}", if id.is_empty() { "model" } else { id })
}

#[cfg(test)]
mod tests {
    use super::storage_name;

    #[test]
    fn storage_names_are_plain_and_keyed_by_content() {
        let fp = "0123456789abcdef";
        assert_eq!(storage_name("http://127.0.0.1:7878/models/demo/", fp), "demo-0123456789abcdef");
        // The helper's owner/name ids arrive percent-encoded: one plain name.
        assert_eq!(
            storage_name("http://127.0.0.1:7878/models/acme%2Ftiny-moe/", fp),
            "acme_2Ftiny-moe-0123456789abcdef"
        );
        assert_eq!(storage_name("https://cdn.example/m/olmoe-int4/?v=2", fp), "olmoe-int4-0123456789abcdef");
        assert_eq!(storage_name("http://127.0.0.1:8080/", fp), "127.0.0.1_8080-0123456789abcdef");
        assert_eq!(storage_name("https://h/..%2F../", fp), "_2F..-0123456789abcdef");
        assert_eq!(storage_name("https://h/.../", fp), "model-0123456789abcdef");
        // The same directory name on two hosts is one name only for the same manifest.
        assert_ne!(storage_name("https://a/x/", fp), storage_name("https://b/x/", "fedcba9876543210"));
    }
}
