//! Hashes each adapter's source at build time, so evidence records can be bound to the exact
//! adapter code that produced them (`adapter_source_hash`), and builds the static supervisor
//! this build carries (`embedded_supervisor`): whoever installs Berth gets the piece docker and
//! bwrap need inside a sandbox, with no second step.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

#[path = "src/adapter_sources.rs"]
mod adapter_sources;

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

/// The same build `scripts/build-supervisor` runs (same target directory and flags, so one is a
/// no-op after the other): static-pie glibc, symbols stripped, so it runs in any Linux image.
fn embed_supervisor(crates: &Path) {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let embedded = out.join("berth-supervisor");
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let target = out
        .ancestors()
        .nth(4)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out.clone());
    let static_dir = target.join("static");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = std::process::Command::new(cargo)
        .current_dir(crates.join(".."))
        .args([
            "rustc",
            "--locked",
            "--release",
            "-q",
            "-p",
            "berth-supervisor",
        ])
        .args(["--bin", "berth-supervisor", "--target-dir"])
        .arg(&static_dir)
        .args([
            "--",
            "-C",
            "target-feature=+crt-static",
            "-C",
            "strip=symbols",
        ])
        // Not clippy's driver (`cargo clippy`), nor the outer build's target directory.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .output();
    let binary = static_dir.join("release").join("berth-supervisor");
    let bytes = match built {
        Ok(done) if done.status.success() => std::fs::read(&binary).unwrap_or_default(),
        Ok(done) => {
            for line in String::from_utf8_lossy(&done.stderr).lines() {
                println!("cargo:warning=static supervisor build: {line}");
            }
            Vec::new()
        }
        Err(e) => {
            println!("cargo:warning=static supervisor build could not start: {e}");
            Vec::new()
        }
    };
    if bytes.is_empty() {
        println!(
            "cargo:warning=this build carries no supervisor: docker and root bwrap need \
             BERTH_SUPERVISOR (scripts/build-supervisor)"
        );
    }
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(&embedded, &bytes).expect("write the embedded supervisor");
    println!("cargo:rustc-env=BERTH_EMBEDDED_SUPERVISOR_SHA256={digest}");
    println!(
        "cargo:rerun-if-changed={}",
        crates.join("berth-supervisor").join("Cargo.toml").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        crates.join("..").join("Cargo.lock").display()
    );
}

fn main() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    embed_supervisor(&crates);
    // Each adapter's sources (relative to `crates/`): its crate and the workspace crates it
    // depends on, and the files outside a crate it runs; and the conformance kit's
    // (`src/adapter_sources.rs`).
    let kit: Vec<String> = adapter_sources::KIT.iter().map(|s| s.to_string()).collect();
    let hashed = adapter_sources::ADAPTERS
        .iter()
        .map(|(id, krate, extra)| (*id, adapter_sources::adapter_sources(&crates, krate, extra)))
        .chain(std::iter::once(("KIT", kit)));
    for (id, sources) in hashed {
        let mut hasher = Sha256::new();
        for source in sources {
            let dir = crates.join(&source);
            println!("cargo:rerun-if-changed={}", dir.display());
            let mut all = Vec::new();
            if dir.is_file() {
                all.push(dir.clone());
            }
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
        println!("cargo:rustc-env=BERTH_SOURCE_{id}=sha256:{digest}");
    }
}
