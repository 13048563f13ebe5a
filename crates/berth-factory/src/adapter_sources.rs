//! Which sources an adapter's evidence is bound to: shared by the build script, which hashes
//! them, and the test that checks the set against Cargo's own dependency graph.
//!
//! An adapter's code is its crate and every workspace crate it depends on (normal dependencies,
//! transitively — the file API's primitives, the contract's defaults, the reaper), each one's
//! `Cargo.toml` and `src/`, plus files an adapter loads at run time (the bridge's). A change to
//! any of them makes the shipped evidence stale. Third-party crates are pinned by `Cargo.lock`
//! and are not part of the hash.

use std::path::Path;

/// Each adapter: the id its hash is compiled under, its crate, and files outside any crate it
/// runs (relative to `crates/`).
pub const ADAPTERS: [(&str, &str, &[&str]); 4] = [
    ("HOST", "berth-provider-host", &[]),
    ("BWRAP", "berth-provider-bwrap", &[]),
    // The supervisor runs inside every docker sandbox (the binary this build embeds): named
    // here so it stays covered whatever the adapter's own Cargo dependencies become.
    ("DOCKER", "berth-provider-docker", &["berth-supervisor"]),
    (
        "COMPUTESDK",
        "berth-provider-computesdk",
        &[
            "../bridge/computesdk/sidecar.mjs",
            "../bridge/computesdk/vendors.mjs",
            "../bridge/computesdk/package-lock.json",
        ],
    ),
];

/// The conformance kit: the clauses and the runner that grades them and writes the record
/// (their own code; what they exercise — adapters, ledger, store — is the subject, not the
/// kit). A record made by another kit is not evidence for this one's clauses.
pub const KIT: [&str; 4] = [
    "berth-conformance/Cargo.toml",
    "berth-conformance/src",
    "berth-verify/Cargo.toml",
    "berth-verify/src",
];

/// The workspace crates named in `krate`'s normal dependencies (`[dependencies]` and
/// `[target.….dependencies]`; not dev or build dependencies).
pub fn workspace_dependencies(crates: &Path, krate: &str) -> Vec<String> {
    let manifest = crates.join(krate).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", manifest.display()));
    let mut normal = false;
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(section) = line.strip_prefix('[') {
            let section = section.trim_end_matches(']');
            normal = section == "dependencies"
                || (section.starts_with("target.") && section.ends_with(".dependencies"));
            // A dependency written as its own table names a crate too.
            if let Some(name) = section.strip_prefix("dependencies.") {
                if crates.join(name).join("Cargo.toml").is_file() {
                    found.push(name.to_owned());
                }
            }
            continue;
        }
        if !normal {
            continue;
        }
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        // Only crates of this workspace: a directory of `crates/` with a manifest.
        if !name.is_empty() && crates.join(&name).join("Cargo.toml").is_file() {
            found.push(name);
        }
    }
    found
}

/// The crates and files an adapter's hash covers, relative to `crates/`, sorted: for each
/// crate, `CRATE/Cargo.toml` and `CRATE/src`.
pub fn adapter_sources(crates: &Path, krate: &str, extra: &[&str]) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut todo = vec![krate.to_owned()];
    let mut files = Vec::new();
    for item in extra {
        if crates.join(item).join("Cargo.toml").is_file() {
            todo.push((*item).to_owned());
        } else {
            files.push((*item).to_owned());
        }
    }
    while let Some(next) = todo.pop() {
        if seen.contains(&next) {
            continue;
        }
        todo.extend(workspace_dependencies(crates, &next));
        seen.push(next);
    }
    for krate in seen {
        files.push(format!("{krate}/Cargo.toml"));
        files.push(format!("{krate}/src"));
    }
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Cargo's own view of the workspace: each package's normal path dependencies.
    fn cargo_graph(crates: &Path) -> Vec<(String, Vec<String>)> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(crates.join(".."))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|package| {
                let deps = package["dependencies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|d| d["kind"].is_null() && d["path"].is_string())
                    .map(|d| d["name"].as_str().unwrap().to_owned())
                    .collect();
                (package["name"].as_str().unwrap().to_owned(), deps)
            })
            .collect()
    }

    /// Every workspace crate an adapter's code runs is in its hash, as Cargo resolves the
    /// graph: a crate the adapter reaches through another (the file API's primitives in
    /// berth-files under berth-local, the contract, the redactor the bridge uses) included.
    /// The list was written by hand before and missed berth-files, berth-contract and
    /// berth-redact: a change there left the shipped evidence "valid".
    #[test]
    fn every_crate_an_adapter_runs_is_in_its_hash() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let graph = cargo_graph(&crates);
        let deps_of = |name: &str| -> Vec<String> {
            graph
                .iter()
                .find(|(package, _)| package == name)
                .map(|(_, deps)| deps.clone())
                .unwrap_or_else(|| panic!("{name} is not a workspace package"))
        };
        for (id, krate, extra) in ADAPTERS {
            let mut closure = BTreeSet::new();
            let mut todo = vec![krate.to_owned()];
            let mut files = BTreeSet::new();
            for item in extra {
                match graph.iter().any(|(package, _)| package == item) {
                    true => todo.push((*item).to_owned()),
                    false => {
                        assert!(crates.join(item).is_file(), "{id}: {item} does not exist");
                        files.insert((*item).to_owned());
                    }
                }
            }
            while let Some(next) = todo.pop() {
                if closure.insert(next.clone()) {
                    todo.extend(deps_of(&next));
                }
            }
            for krate in &closure {
                files.insert(format!("{krate}/Cargo.toml"));
                files.insert(format!("{krate}/src"));
            }
            let hashed: BTreeSet<String> =
                adapter_sources(&crates, krate, extra).into_iter().collect();
            assert_eq!(hashed, files, "{id}");
        }
        let host = adapter_sources(&crates, "berth-provider-host", &[]);
        for needed in [
            "berth-files/src",
            "berth-contract/src",
            "berth-local/src",
            "berth-supervisor/src",
        ] {
            assert!(
                host.iter().any(|s| s == needed),
                "host misses {needed}: {host:?}"
            );
        }
    }

    /// The kit's hash covers files that exist (a renamed or moved crate would leave it covering
    /// nothing, and every record would stay "graded by this kit").
    #[test]
    fn the_conformance_kit_is_where_its_hash_looks() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for source in KIT {
            assert!(crates.join(source).exists(), "{source} does not exist");
        }
        assert!(crates.join("berth-conformance/src/lib.rs").is_file());
    }

    /// The manifest reader takes every form Cargo accepts for a normal dependency and skips
    /// dev and build dependencies.
    #[test]
    fn dependency_forms() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a", "b", "c", "d", "e", "f"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("Cargo.toml"), "[package]\n").unwrap();
        }
        std::fs::write(
            dir.path().join("a").join("Cargo.toml"),
            "[package]\nname = \"a\"\n[dependencies]\nb.workspace = true\nc = { path = \"../c\" }\n\
             serde = \"1\"\n[dependencies.d]\nworkspace = true\n\
             [target.'cfg(unix)'.dependencies]\ne = { workspace = true }\n\
             [dev-dependencies]\nf.workspace = true\n[build-dependencies]\nf = \"1\"\n",
        )
        .unwrap();
        let mut found = workspace_dependencies(dir.path(), "a");
        found.sort();
        assert_eq!(found, ["b", "c", "d", "e"]);
    }
}
