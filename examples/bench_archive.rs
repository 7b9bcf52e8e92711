//! Runs the archive benchmark ([`idemgate::bench::archive`]) and prints its tables:
//! `cargo run --release --example bench_archive -- [--backends postgres,mysql] [--rows 1000000]
//! [--batch-size 5000] [--pause-ms 50] [--concurrency 4] [--messages 4000]`.

use std::time::Duration;

use anyhow::Context;
use idemgate::bench::archive::{self, Options};
use idemgate::store::Backend;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut options = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--backends" => {
                options.backends =
                    value.split(',').map(|b| b.parse::<Backend>()).collect::<Result<_, _>>()?;
            }
            "--rows" => options.rows = value.parse().context("--rows")?,
            "--batch-size" => options.batch_size = value.parse().context("--batch-size")?,
            "--pause-ms" => options.pause = Duration::from_millis(value.parse().context("--pause-ms")?),
            "--concurrency" => options.concurrency = value.parse().context("--concurrency")?,
            "--messages" => options.messages = value.parse().context("--messages")?,
            other => anyhow::bail!("unknown option {other}"),
        }
    }
    println!(
        "bench archive: {} expired claims, batches of {}, pause {} ms beside {} consumers in flight, {} cores",
        options.rows,
        options.batch_size,
        options.pause.as_millis(),
        options.concurrency,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let reports = archive::run(&options, |line| eprintln!("  {line}")).await?;
    println!("\n{}\n{}", archive::table(&reports), archive::guard_table(&reports));
    Ok(())
}
