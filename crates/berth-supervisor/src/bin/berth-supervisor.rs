//! `berth-supervisor serve --socket PATH`: the in-sandbox supervisor (see the library docs).

fn main() {
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if raw
        .get(1)
        .is_some_and(|a| a == berth_supervisor::reaper::REAP_ARG)
    {
        std::process::exit(berth_supervisor::reaper::run(&raw[2..]));
    }
    if raw
        .get(1)
        .is_some_and(|a| a == berth_supervisor::enter::ENTER_ARG)
    {
        std::process::exit(berth_supervisor::enter::run(&raw[2..]));
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
