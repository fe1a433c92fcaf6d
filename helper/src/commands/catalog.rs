//! The short catalog of models `coli pull --list` prints and `coli run NAME` takes by its
//! short name: the families colibri's forward pass is checked against transformers on
//! (tests/fixtures), one public release each. The sizes are `coli plan`'s for the
//! configurations in tests/hub-configs (the README's table; a test keeps them equal).

use crate::commands::info::human;

pub struct Entry {
    /// The short name `coli run` and `coli pull` take.
    pub name: &'static str,
    pub repo: &'static str,
    pub family: &'static str,
    /// What `coli pull` stores, as the README's table says (GiB).
    pub disk_gib: f64,
    /// Dense weights, always in memory (GiB).
    pub dense_gib: f64,
}

pub const CATALOG: &[Entry] = &[
    Entry { name: "olmoe", repo: "allenai/OLMoE-1B-7B-0924", family: "olmoe", disk_gib: 3.8, dense_gib: 0.5 },
    Entry { name: "qwen3-30b-a3b", repo: "Qwen/Qwen3-30B-A3B", family: "qwen3_moe", disk_gib: 16.7, dense_gib: 1.5 },
    Entry { name: "mixtral", repo: "mistralai/Mixtral-8x7B-v0.1", family: "mixtral", disk_gib: 25.1, dense_gib: 1.5 },
    Entry {
        name: "qwen3.5-35b-a3b",
        repo: "Qwen/Qwen3.5-35B-A3B",
        family: "qwen3_5_moe",
        disk_gib: 19.2,
        dense_gib: 2.4,
    },
    Entry {
        name: "deepseek-v3.2",
        repo: "deepseek-ai/DeepSeek-V3.2-Exp",
        family: "deepseek_v32",
        disk_gib: 359.9,
        dense_gib: 17.3,
    },
    Entry { name: "glm-5", repo: "zai-org/GLM-5", family: "glm_moe_dsa", disk_gib: 398.1, dense_gib: 18.4 },
    Entry { name: "kimi-k2", repo: "moonshotai/Kimi-K2-Instruct", family: "kimi_k2", disk_gib: 991.0, dense_gib: 16.5 },
];

/// The hub repository a catalog name stands for; anything else as it is.
pub fn resolve(name: &str) -> &str {
    CATALOG.iter().find(|e| e.name.eq_ignore_ascii_case(name)).map_or(name, |e| e.repo)
}

/// `coli pull --list`: the catalog, with what is installed in `models` marked.
pub fn print(models: Option<&std::path::Path>) {
    println!("{:<16} {:<32} {:<13} {:>10} {:>9}  installed", "name", "repository", "family", "disk", "dense");
    for e in CATALOG {
        let installed = models.is_some_and(|m| m.join(e.repo).join("config.json").is_file());
        let gib = |g: f64| human((g * (1u64 << 30) as f64) as u64);
        println!(
            "{:<16} {:<32} {:<13} {:>10} {:>9}  {}",
            e.name,
            e.repo,
            e.family,
            gib(e.disk_gib),
            gib(e.dense_gib),
            if installed { "yes" } else { "" }
        );
    }
    println!("coli run NAME pulls one (after checking it can run here) and chats; coli plan REPO says more first.");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's table (which helper/tests/it/pull_cli.rs keeps equal to `coli plan`)
    /// gives the catalog's sizes.
    #[test]
    fn the_catalog_is_the_readme_table() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        for e in CATALOG {
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| {} |", e.repo)))
                .unwrap_or_else(|| panic!("{} is not in the README's table", e.repo));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert_eq!(cells[2], e.family, "{row}");
            assert_eq!(cells[3], format!("{:.1} GiB", e.dense_gib), "{row}");
            assert!(cells[6].starts_with(&format!("{:.1} GiB", e.disk_gib)), "{row}");
        }
        assert_eq!(resolve("OLMoE"), "allenai/OLMoE-1B-7B-0924");
        assert_eq!(resolve("acme/x"), "acme/x");
    }
}
