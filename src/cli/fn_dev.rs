//! `htfaas fn new|build|run`: a function developer's commands, no stack needed. `new` and
//! `build` are [`htfaas::devkit`]; `run` is [`htfaas_ep::local::run_local`], the EP's own runtime
//! and limits on a local file. Must not know: the toolchains' command lines, the runtime's
//! insides.

use anyhow::Context as _;
use clap::Subcommand;
use htfaas::devkit::{self, Lang, Project, Tools};
use htfaas_ep::local::{LocalOutput, LocalRun, LocalRunOptions, run_local};
use htfaas_functions::proto::Outcome;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum DevCommand {
    /// Make a new function project: its source (the guest contract in its first comment),
    /// htfaas.toml, a sample input and a README.
    New {
        /// Function name (a-z, 0-9, '-', '_').
        name: String,
        /// Language: rust, c, python or js.
        #[arg(long, value_parser = parse_lang)]
        lang: Lang,
        /// Directory to create (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// `native`: a Python + numpy function run in an image (with --lang python), instead of
        /// wasm.
        #[arg(long, default_value = "wasm", value_parser = ["wasm", "native"])]
        runtime: String,
    },
    /// Build a function project into wasm (Rust, C: a WASI preview 1 module; Python, JavaScript:
    /// a preview 2 component). The language comes from htfaas.toml (or the project's files).
    Build {
        /// The project directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// The wasm file to write (default: DIR/NAME.wasm).
        #[arg(short = 'o', long = "out")]
        out: Option<PathBuf>,
    },
    /// Run a function on a local file in the EP's own runtime (same sandbox and limits as a
    /// job), with no stack: prints what it wrote, its log, its usage and its outcome. Exits 1
    /// unless the run succeeded.
    Run {
        /// The wasm file, then the input file (staged as /input/<its name>); with --image,
        /// only the input file.
        #[arg(num_args = 1..=2, required = true, value_name = "WASM INPUT")]
        files: Vec<PathBuf>,
        /// A native function: its image tar (`htfaas image build --no-push`), run with --command
        /// in the EP's native sandbox (as root: bubblewrap, cgroups).
        #[arg(long, requires = "command")]
        image: Option<PathBuf>,
        /// With --image: the command in the image, words separated by spaces.
        #[arg(long, requires = "image")]
        command: Option<String>,
        /// With --image: the command is a handler (`fn register --handler`); the input is
        /// served to it as one request on its stdin, its answer read from descriptor 3.
        #[arg(long, requires = "image")]
        handler: bool,
        /// With --image: cores (the cpu quota).
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Where the outputs it leaves are copied.
        #[arg(long, default_value = "out")]
        out: PathBuf,
        /// Memory cap, MiB.
        #[arg(long, default_value_t = 2048)]
        memory_mb: u64,
        /// Wall-time cap, seconds.
        #[arg(long, default_value_t = 60)]
        timeout_s: u64,
        /// An environment variable of the guest, K=V (repeatable; nothing else is inherited).
        #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
        env: Vec<(String, String)>,
        /// An argument after the input path (repeatable).
        #[arg(long = "arg")]
        args: Vec<String>,
        /// Instruction budget (fuel), as an EP with `fuel` set meters it.
        #[arg(long)]
        fuel: Option<u64>,
        /// Compile every time instead of keeping the compiled module in
        /// $XDG_CACHE_HOME/htfaas/artifacts (or ~/.cache/htfaas/artifacts).
        #[arg(long)]
        no_cache: bool,
    },
}

fn parse_lang(s: &str) -> Result<Lang, String> {
    s.parse().map_err(|e: devkit::DevError| e.to_string())
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?}: expected KEY=VALUE")),
    }
}

/// Where `fn run` keeps compiled modules.
fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache"))).map(|d| d.join("htfaas/artifacts"))
}

/// `htfaas fn new|build|run`.
pub async fn run(command: DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::New { name, lang, dir, runtime } if runtime == "native" => {
            if lang != Lang::Python {
                anyhow::bail!(
                    "--runtime native has a template for --lang python (numpy); other native code \
                               goes into an image with `htfaas image build --add`"
                );
            }
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let files = devkit::new_native_project(&name, &dir)?;
            println!("created {} (python, native):", dir.display());
            for f in files {
                println!("  {}", f.display());
            }
            println!("next: cd {} && ./build-image.sh --no-push (then see README.md)", dir.display());
            Ok(())
        }
        DevCommand::New { name, lang, dir, .. } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let files = devkit::new_project(&name, lang, &dir)?;
            println!("created {} ({lang}):", dir.display());
            for f in files {
                println!("  {}", f.display());
            }
            println!("next: cd {} && htfaas fn build && htfaas fn run {name}.wasm sample.txt", dir.display());
            Ok(())
        }
        DevCommand::Build { dir, out } => {
            let project = Project::detect(&dir)?;
            let tools = Tools::from_env(&dir);
            println!("building {} ({}) …", project.name, project.lang);
            let built = tokio::task::spawn_blocking(move || devkit::build(&project, out.as_deref(), &tools))
                .await
                .context("the build task")??;
            println!("built {} ({} bytes) in {:.1} s", built.path.display(), built.bytes, built.took.as_secs_f64());
            Ok(())
        }
        DevCommand::Run {
            files,
            image: Some(image),
            command,
            handler,
            cpus,
            out,
            memory_mb,
            timeout_s,
            env,
            args,
            ..
        } => {
            let [input] = files.as_slice() else {
                anyhow::bail!("with --image, give only the input file");
            };
            let command: Vec<String> = command.unwrap_or_default().split_whitespace().map(str::to_owned).collect();
            let cache =
                cache_dir().map(|d| d.with_file_name("images")).unwrap_or_else(|| PathBuf::from(".htfaas-images"));
            let opts = htfaas_ep::local::NativeLocalOptions {
                memory_mb,
                runtime_s: timeout_s,
                cpus,
                env,
                args,
                cache_dir: cache,
                handler,
            };
            let scratch = tempfile::tempdir().context("create a scratch directory")?;
            let ran = htfaas_ep::local::run_native_local(&image, &command, input, scratch.path(), &out, &opts).await?;
            println!("image    {}, ready in {} ms", ran.digest.short(), ran.image_ms);
            print_outcome(&ran.run, &ran.outputs, &ran.skipped, &out);
            if ran.run.outcome.is_success() { Ok(()) } else { anyhow::bail!("{}", ran.run.outcome.reason()) }
        }
        DevCommand::Run { files, image: None, out, memory_mb, timeout_s, env, args, fuel, no_cache, .. } => {
            let [wasm, input] = files.as_slice() else {
                anyhow::bail!("give the wasm file and the input file (or --image with the input file)");
            };
            let (wasm, input) = (wasm.clone(), input.clone());
            let name = wasm.file_stem().and_then(|s| s.to_str()).unwrap_or("function").to_owned();
            let opts = LocalRunOptions {
                memory_mb,
                runtime_s: timeout_s,
                env,
                args,
                name,
                fuel,
                log_limit_bytes: 1 << 20,
                cache_dir: if no_cache { None } else { cache_dir() },
            };
            let scratch = tempfile::tempdir().context("create a scratch directory")?;
            let out_dir = out.clone();
            let ran = tokio::task::spawn_blocking(move || run_local(&wasm, &input, scratch.path(), &out_dir, &opts))
                .await
                .context("the run's task")??;
            print_run(&ran, &out);
            if ran.run.outcome.is_success() { Ok(()) } else { anyhow::bail!("{}", ran.run.outcome.reason()) }
        }
    }
}

fn print_run(ran: &LocalRun, out: &std::path::Path) {
    let how = if ran.compiled { "compiled" } else { "loaded from the cache" };
    println!("module   {} ({:?}), {how} in {} ms", ran.digest.short(), ran.kind, ran.load_ms);
    print_outcome(&ran.run, &ran.outputs, &ran.skipped, out);
}

/// A local run's outputs, log, usage and outcome (wasm or native alike).
fn print_outcome(r: &htfaas_ep::runtime::GuestRun, outputs: &[LocalOutput], skipped: &[String], out: &std::path::Path) {
    match outputs.len() {
        0 => println!("outputs  none"),
        n => println!("outputs  {n}, in {}:", out.display()),
    }
    for o in outputs {
        println!("  {}  {} bytes  sha256 {}", o.name, o.size, o.sha256);
    }
    for s in skipped {
        println!("  not stored: {s}");
    }
    for (name, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        if text.is_empty() {
            println!("{name}   (empty)");
        } else {
            println!("{name}:");
            for line in String::from_utf8_lossy(text).lines() {
                println!("  {line}");
            }
        }
    }
    if r.log_dropped > 0 {
        println!("log      {} bytes dropped (past the log limit)", r.log_dropped);
    }
    let fuel = r.instructions.map(|i| format!(", {i} instructions")).unwrap_or_default();
    println!(
        "usage    cpu {} ms, wall {} ms, peak memory {:.1} MiB{fuel}",
        r.cpu_ms,
        r.wall_ms,
        r.peak_memory_bytes as f64 / f64::from(1 << 20)
    );
    let outcome = match &r.outcome {
        Outcome::Exited { exit_code } => format!("exited {exit_code}"),
        other => other.reason(),
    };
    println!("outcome  {outcome}");
    for n in &r.notes {
        println!("note     {}", n.lines().next().unwrap_or_default());
    }
}
