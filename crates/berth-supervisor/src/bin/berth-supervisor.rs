//! `berth-supervisor serve --socket PATH`: the in-sandbox supervisor (see the library docs).

fn main() {
    if let Some(code) = berth_supervisor::helper_mode(&std::env::args_os().collect::<Vec<_>>()) {
        std::process::exit(code);
    }
    let args: Vec<String> = std::env::args().collect();
    let socket = match args.as_slice() {
        [_, serve, flag, path] if serve == "serve" && flag == "--socket" => path.clone(),
        [_, version] if version == "--version" => {
            println!("berth-supervisor {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        _ => {
            eprintln!("usage: berth-supervisor serve --socket PATH");
            std::process::exit(2);
        }
    };
    if let Err(err) = berth_supervisor::server::serve(std::path::Path::new(&socket)) {
        eprintln!("berth-supervisor: cannot serve on {socket}: {err}");
        std::process::exit(1);
    }
}
