//! The embedded manifests, also as JSON: a provider is built from its manifest at every start of
//! a short `berth` process, and the `toml` crate took 75–230 µs per manifest there against
//! 6–30 µs for `serde_json` on the same data. The TOML files stay the source (and what
//! `catalog show --catalog DIR` reads); `parse_embedded` uses a JSON form only for the exact text
//! it was made from.
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new("../../catalog/providers");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("catalog/providers is readable")
        .map(|entry| entry.expect("a catalog entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for path in files {
        println!("cargo:rerun-if-changed={}", path.display());
        // A manifest that cannot be read, named or parsed here gets no JSON form: `parse`
        // reads its text and reports it as it should.
        let (Ok(text), Some(name)) = (
            std::fs::read_to_string(&path),
            path.file_name().and_then(|n| n.to_str()),
        ) else {
            continue;
        };
        let Ok(value) = text.parse::<toml::Table>() else {
            continue;
        };
        let json = serde_json::to_string(&value).expect("a TOML table is JSON");
        writeln!(
            out,
            "    ({:?}, {:?}, {:?}),",
            format!("catalog/providers/{name}"),
            text,
            json
        )
        .unwrap();
    }
    out.push(']');
    let target = Path::new(&std::env::var("OUT_DIR").unwrap()).join("embedded_json.rs");
    std::fs::write(target, out).expect("OUT_DIR is writable");
}
