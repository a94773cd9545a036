use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = quire::cli::Cli::parse();
    if let Err(e) = quire::cli::main_with(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
