//! The `datahelix` command; see `datahelix --help` and `shared/CLI.md`.

use clap::Parser;

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DATAHELIX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let cli = datahelix::cli::Cli::parse();
    std::process::exit(datahelix::cli::run(cli));
}
