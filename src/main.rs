use clap::Parser;

fn main() {
    // NVLink multicast (NVLS) stays off in every process Quire starts:
    // NCCL reads this when a tensor-parallel group is created. Set before
    // any thread exists.
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    // Quire's own INFO lines (the device, the kernel cache, a kernel
    // choice the tuning table asked for and did not get) and everyone's
    // warnings, unless RUST_LOG says otherwise.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,quire=info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = quire::cli::Cli::parse();
    if let Err(e) = quire::cli::main_with(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
