//! Hashes each adapter's source at build time, so evidence records can be bound to the exact
//! adapter code that produced them (`adapter_source_hash`).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let adapters: [(&str, &[&str]); 3] = [
        // Host and bwrap commands run under the supervisor crate's reaper (and bwrap's entry).
        (
            "HOST",
            &["berth-provider-host", "berth-local", "berth-supervisor"],
        ),
        (
            "BWRAP",
            &["berth-provider-bwrap", "berth-local", "berth-supervisor"],
        ),
        ("DOCKER", &["berth-provider-docker", "berth-supervisor"]),
    ];
    for (id, sources) in adapters {
        let mut hasher = Sha256::new();
        for source in sources {
            let dir = crates.join(source).join("src");
            println!("cargo:rerun-if-changed={}", dir.display());
            let mut all = Vec::new();
            files(&dir, &mut all);
            all.sort();
            for file in all {
                let relative = file.strip_prefix(&crates).unwrap_or(&file);
                hasher.update(relative.to_string_lossy().as_bytes());
                hasher.update([0]);
                hasher.update(std::fs::read(&file).unwrap_or_default());
                hasher.update([0]);
            }
        }
        let digest: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!("cargo:rustc-env=BERTH_ADAPTER_SOURCE_{id}=sha256:{digest}");
    }
}
