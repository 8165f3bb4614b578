//! `dsec image build|setup|import|pull|push|ls|inspect|rm|gc`: images are
//! built or imported on this node, straight into its image store, and
//! pushed to registries or shared stores, with progress bars.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use dsec_api::ImageInfo;
use dsec_image::build::{build_layer_debootstrap, build_layer_from_dir, build_layer_from_tar, DebootstrapRecipe};
use dsec_image::oci::push::push;
use dsec_image::oci::registry::{pull, RegistryOptions};
use dsec_image::oci::{import_path, parse_platform, ImportOptions};
use dsec_image::shared::{S3Options, SharedStore};
use dsec_image::{
    build_default_image, find_default_image, unrecorded_hint, BuildOptions, Compression, DefaultImage, Found, ImageConfig, ImageStore,
    LayerKind, Progress, Reference, Unit,
};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Subcommand, Debug)]
pub enum ImageCmd {
    /// Build an image from a Dockerfile (`-f Dockerfile [CONTEXT]`, on the
    /// platform's API), a directory, a tar(.gz) or a debootstrap run.
    Build(Box<BuildArgs>),
    /// Build the default images (busybox, python, judge) that are missing or
    /// were made from an older recipe.
    Setup(SetupArgs),
    /// Import an OCI image layout (directory or tar) or a `docker save`
    /// archive (.tar or .tar.gz).
    Import(ImportArgs),
    /// Pull an image from an OCI registry (`[registry/]repo[:tag|@digest]`;
    /// plain HTTP for registries on loopback, HTTPS otherwise).
    Pull(PullArgs),
    /// Add a full VM disk image (any format qemu-img reads: qcow2, raw,
    /// vmdk, ...) as `NAME` for `backend="vm"`. The guest must start
    /// `dsec-agent guest` at boot (see docs/vm.md).
    ImportVm {
        name: String,
        disk: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Print an image's manifest (layers, kinds, sizes, config) as JSON.
    Inspect {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete layer blobs no image names any more, and stale temp files.
    Gc {
        /// Empty the Dockerfile builds' step cache first (the next build of
        /// each Dockerfile runs every step again).
        #[arg(long)]
        build_cache: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Push an image to an OCI registry (`dsec image push NAME
    /// [registry/]repo[:tag]`: one tar+gzip layer per dsec layer, readable by
    /// any OCI client), or with `--to` copy it into a store many nodes share
    /// (`dsec up --shared-store`), with the chunk tables nodes need to load
    /// its layers on demand.
    Push {
        name: String,
        /// The registry reference to push to, `[registry/]repository[:tag]`.
        #[arg(required_unless_present = "to", conflicts_with = "to")]
        destination: Option<String>,
        /// The shared store: a directory, or `s3://bucket[/prefix]`.
        #[arg(long)]
        to: Option<String>,
        /// Plain HTTP even for a registry that is not on loopback.
        #[arg(long, requires = "destination")]
        plain_http: bool,
        #[command(flatten)]
        s3: S3Args,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Copy an image from a shared store into this node's store now
    /// (an edge with --shared-store also does it on first use).
    Fetch {
        name: String,
        /// The shared store: a directory, or `s3://bucket[/prefix]`.
        #[arg(long)]
        from: String,
        #[command(flatten)]
        s3: S3Args,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List images.
    Ls(StoreArgs),
    /// Remove images (their layers go at the next gc).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Args, Debug)]
pub struct StoreArgs {
    /// Image store directory. Default: $DSEC_DATA_DIR/images.
    #[arg(long, env = "DSEC_IMAGES_DIR")]
    pub images_dir: Option<PathBuf>,
}

impl StoreArgs {
    fn dir(&self) -> PathBuf {
        self.images_dir.clone().unwrap_or_else(|| crate::default_data_dir().join("images"))
    }

    pub(crate) fn open(&self) -> anyhow::Result<ImageStore> {
        let dir = self.dir();
        ImageStore::open(&dir).with_context(|| format!("opening the image store at {}", dir.display()))
    }
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// `name` or `name:tag`.
    pub name: String,
    /// A Dockerfile: build on the platform (through its API, like any
    /// client), each RUN in a sandbox, with CONTEXT as the build context.
    #[arg(short = 'f', long = "file", group = "source")]
    pub dockerfile: Option<PathBuf>,
    /// The build context of a Dockerfile build (default: the current
    /// directory).
    #[arg(requires = "dockerfile")]
    pub context: Option<PathBuf>,
    /// `KEY=VALUE` for the Dockerfile's ARGs (repeatable).
    #[arg(long = "build-arg", requires = "dockerfile")]
    pub build_args: Vec<String>,
    /// The stage to build (default: the last).
    #[arg(long, requires = "dockerfile")]
    pub target: Option<String>,
    /// Run every step, even those the step cache holds.
    #[arg(long, requires = "dockerfile")]
    pub no_cache: bool,
    /// RUN steps' network: default (the node's named services), none, or a
    /// JSON object of rules.
    #[arg(long, requires = "dockerfile")]
    pub network: Option<String>,
    #[command(flatten)]
    pub conn: crate::connect::ConnectArgs,
    /// Root filesystem directory.
    #[arg(long, group = "source")]
    pub from_dir: Option<PathBuf>,
    /// Root filesystem as a .tar or .tar.gz.
    #[arg(long, group = "source")]
    pub from_tar: Option<PathBuf>,
    /// Debian suite for debootstrap --variant=minbase (e.g. bookworm).
    #[arg(long, group = "source")]
    pub debootstrap: Option<String>,
    /// Extra packages for --debootstrap (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    pub packages: Vec<String>,
    #[arg(long, env = "DSEC_DEBIAN_MIRROR", default_value = "http://deb.debian.org/debian")]
    pub mirror: String,
    /// base, workspace or toolkit.
    #[arg(long, default_value = "base")]
    pub kind: String,
    /// Compress data with lz4hc (smaller, slower to build and to read).
    #[arg(long)]
    pub compress: bool,
    /// Environment of commands, KEY=VALUE (repeatable).
    #[arg(long = "env")]
    pub env: Vec<String>,
    #[arg(long)]
    pub workdir: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Args, Debug)]
pub struct SetupArgs {
    #[arg(long, env = "DSEC_DEBIAN_MIRROR", default_value = "http://deb.debian.org/debian")]
    pub mirror: String,
    /// Only these default images (busybox, python, judge), the microVM
    /// guest kernel (vm-kernel) or the full VM's base image (debian-vm).
    #[arg(long = "only")]
    pub only: Vec<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// How OCI layers become dsec layers (shared by import and pull).
#[derive(Args, Debug)]
pub struct OciArgs {
    /// Store as `name[:tag]` (default: the source's own name and tag).
    #[arg(long)]
    pub name: Option<String>,
    /// `os/arch[/variant]` of a multi-platform image (default: this host's).
    #[arg(long)]
    pub platform: Option<String>,
    /// Merge consecutive OCI layers into one dsec layer until it holds
    /// this many MiB of layer data (0: one dsec layer per OCI layer).
    #[arg(long, default_value_t = 64)]
    pub merge_below_mb: u64,
    /// Compress data with lz4hc (smaller, slower to build and to read).
    #[arg(long)]
    pub compress: bool,
}

impl OciArgs {
    fn options(&self, select: Option<String>) -> anyhow::Result<ImportOptions> {
        let platform = match &self.platform {
            Some(p) => Some(parse_platform(p).ok_or_else(|| anyhow::anyhow!("--platform must be os/arch[/variant], not {p:?}"))?),
            None => None,
        };
        Ok(ImportOptions {
            reference: self.name.as_deref().map(parse_reference).transpose()?,
            select,
            platform,
            merge_below: self.merge_below_mb.saturating_mul(1 << 20),
            build: BuildOptions { compression: if self.compress { Compression::Lz4hc { level: None } } else { Compression::None } },
        })
    }
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// OCI layout directory, or a .tar / .tar.gz (OCI layout or `docker save`).
    pub source: PathBuf,
    /// Which image of a source holding several (a tag or a digest).
    #[arg(long)]
    pub select: Option<String>,
    #[command(flatten)]
    pub oci: OciArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Args, Debug)]
pub struct PullArgs {
    /// `[registry/]repository[:tag|@sha256:...]`.
    pub reference: String,
    /// Plain HTTP even for a registry that is not on loopback.
    #[arg(long)]
    pub plain_http: bool,
    #[command(flatten)]
    pub oci: OciArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Draws a build's progress: a spinner with the current stage, turning into
/// a bar (bytes or items, rate, ETA) when the builder reports a total.
struct Bars {
    bar: ProgressBar,
    unit: Mutex<Option<Unit>>,
    /// Without a terminal (CI logs), stages are printed as plain lines.
    plain: bool,
}

impl Bars {
    fn new(prefix: &str) -> Bars {
        let bar = ProgressBar::new_spinner();
        bar.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {prefix}: {wide_msg}").expect("valid template"));
        bar.set_prefix(prefix.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        let plain = !std::io::IsTerminal::is_terminal(&std::io::stderr());
        Bars { bar, unit: Mutex::new(None), plain }
    }

    fn finish(&self, msg: String) {
        if self.plain {
            eprintln!("{}: {msg}", self.bar.prefix());
        }
        self.bar.finish_with_message(msg);
    }
}

impl Progress for Bars {
    fn stage(&self, text: &str) {
        if self.plain {
            eprintln!("{}: {}", self.bar.prefix(), text.trim());
        }
        self.bar.set_message(text.trim().to_string());
    }

    fn advance(&self, done: u64, total: Option<u64>, unit: Unit) {
        let mut current = self.unit.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(total) = total {
            if *current != Some(unit) || self.bar.length() != Some(total) {
                let tmpl = match unit {
                    Unit::Bytes => {
                        "{spinner} [{elapsed_precise}] {prefix}: [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {wide_msg}"
                    }
                    Unit::Items => "{spinner} [{elapsed_precise}] {prefix}: [{bar:30}] {pos}/{len} {per_sec} ETA {eta} {wide_msg}",
                };
                self.bar.set_style(ProgressStyle::with_template(tmpl).expect("valid template").progress_chars("=> "));
                self.bar.set_length(total);
                *current = Some(unit);
            }
        }
        self.bar.set_position(done);
    }
}

pub async fn run(cmd: ImageCmd) -> anyhow::Result<u8> {
    // A Dockerfile build is the platform's work; this only streams.
    if let ImageCmd::Build(a) = cmd {
        if a.dockerfile.is_some() {
            return crate::dockerfile_cmd::build(*a).await;
        }
        return tokio::task::spawn_blocking(move || build(*a)).await?;
    }
    // Builds are long blocking work (mkfs, debootstrap): keep them off the
    // async runtime's workers.
    tokio::task::spawn_blocking(move || run_blocking(cmd)).await?
}

fn run_blocking(cmd: ImageCmd) -> anyhow::Result<u8> {
    match cmd {
        ImageCmd::Build(a) => build(*a),
        ImageCmd::Setup(a) => setup(a),
        ImageCmd::ImportVm { name, disk, store } => import_vm(&name, &disk, &store),
        ImageCmd::Import(a) => {
            let store = a.store.open()?;
            let options = a.oci.options(a.select.clone())?;
            let label = a.source.display().to_string();
            finish_import(&label, |bars| import_path(&store, &a.source, &options, bars))
        }
        ImageCmd::Pull(a) => {
            let store = a.store.open()?;
            let options = a.oci.options(None)?;
            let pull_options = RegistryOptions { plain_http: a.plain_http, credentials: registry_credentials() };
            finish_import(&a.reference, |bars| pull(&store, &a.reference, &pull_options, &options, bars))
        }
        ImageCmd::Inspect { name, store } => {
            let store = store.open()?;
            let reference = parse_reference(&name)?;
            // Also an image whose layers arrive on demand: its manifest is
            // here, its blobs (null) not yet.
            let manifest = store.stored_manifest(&reference)?;
            let blobs: Vec<Option<String>> = manifest
                .layers
                .iter()
                .map(|l| store.has_blob(&l.digest).then(|| store.blob_path(&l.digest).display().to_string()))
                .collect();
            let out = serde_json::json!({
                "name": reference.to_string(),
                "manifest": serde_json::from_slice::<serde_json::Value>(&manifest.to_json()?)?,
                "blobs": blobs,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(0)
        }
        ImageCmd::Push { name, destination: Some(destination), plain_http, store, .. } => {
            let local = store.open()?;
            let options = RegistryOptions { plain_http, credentials: registry_credentials() };
            push_to_registry(&local, &name, &destination, &options)
        }
        ImageCmd::Push { name, to: Some(to), s3, store, .. } => {
            let local = store.open()?;
            let shared = SharedStore::open(&to, &s3.options()).with_context(|| format!("opening the shared store {to}"))?;
            copy_between(Direction::Push(&local, &shared), &name)
        }
        ImageCmd::Push { .. } => anyhow::bail!("give a registry reference or --to SHARED_STORE"),
        ImageCmd::Fetch { name, from, s3, store } => {
            let local = store.open()?;
            let shared = SharedStore::open(&from, &s3.options()).with_context(|| format!("opening the shared store {from}"))?;
            copy_between(Direction::Fetch(&shared, &local), &name)
        }
        ImageCmd::Gc { build_cache, store: s } => {
            let store = s.open()?;
            if build_cache {
                let mut removed = 0;
                for e in store.list()? {
                    let name = e.reference.to_string();
                    if dsec_build::is_cache_image(&name) {
                        store.remove(&name)?;
                        removed += 1;
                    }
                }
                println!("removed {removed} step-cache images");
            }
            let stats = store.gc(&std::collections::HashSet::new())?;
            println!("removed {} blobs ({})", stats.blobs_removed, human_bytes(stats.bytes_removed));
            Ok(0)
        }
        ImageCmd::Ls(s) => {
            let store = s.open()?;
            println!("{:<24} {:>10} {:>7}  {:<24} LAYERS", "NAME", "SIZE", "LAYERS", "CREATED");
            for img in Catalog::infos(&store)? {
                println!(
                    "{:<24} {:>10} {:>7}  {:<24} {}",
                    img.name,
                    human_bytes(img.size_bytes),
                    img.layers.len(),
                    img.created_at,
                    img.layers.iter().map(|l| short_digest(l)).collect::<Vec<_>>().join(",")
                );
            }
            Ok(0)
        }
        ImageCmd::Rm { names, store } => {
            let store = store.open()?;
            let mut code = 0;
            for n in names {
                match store.remove(&n) {
                    Ok(()) => println!("{n}"),
                    Err(e) => {
                        eprintln!("{n}: {e}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
    }
}

fn short_digest(d: &str) -> &str {
    let hex = d.strip_prefix("sha256:").unwrap_or(d);
    &hex[..hex.len().min(12)]
}

pub(crate) fn human_bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

fn build(a: BuildArgs) -> anyhow::Result<u8> {
    let store = a.store.open()?;
    let reference: Reference = parse_reference(&a.name)?;
    let Some(kind) = LayerKind::parse(&a.kind) else {
        anyhow::bail!("--kind must be base, workspace or toolkit, not {:?}", a.kind);
    };
    let options = BuildOptions { compression: if a.compress { Compression::Lz4hc { level: None } } else { Compression::None } };
    let mut config = ImageConfig::default();
    config.env.extend(a.env.iter().cloned());
    if let Some(w) = &a.workdir {
        config.workdir = w.clone();
    }
    let bars = Bars::new(&a.name);
    let started = std::time::Instant::now();
    let result = dsec_image::build::build_image(&store, &reference, kind, config, || {
        if let Some(dir) = &a.from_dir {
            build_layer_from_dir(&store, dir, &options, &bars)
        } else if let Some(tar) = &a.from_tar {
            build_layer_from_tar(&store, tar, &options, &bars)
        } else if let Some(suite) = &a.debootstrap {
            let mut recipe = DebootstrapRecipe::new(suite);
            recipe.mirror = a.mirror.clone();
            recipe.include = a.packages.clone();
            build_layer_debootstrap(&store, &recipe, &options, &bars)
        } else {
            Err(dsec_image::BuildError::InvalidRecipe("give one of --from-dir, --from-tar, --debootstrap".into()))
        }
    });
    match result {
        Ok(img) => {
            let size: u64 = img.layers.iter().map(|l| l.size).sum();
            bars.finish(format!("built {} ({}) in {:.1?}", a.name, human_bytes(size), started.elapsed()));
            Ok(0)
        }
        Err(e) => {
            bars.bar.abandon_with_message("failed");
            Err(e.into())
        }
    }
}

/// Which way an image goes between this node and a shared store.
enum Direction<'a> {
    Push(&'a ImageStore, &'a SharedStore),
    Fetch(&'a SharedStore, &'a ImageStore),
}

/// Copies one image between stores under a progress bar.
fn copy_between(direction: Direction<'_>, name: &str) -> anyhow::Result<u8> {
    let reference = parse_reference(name)?;
    let bars = Bars::new(name);
    let result = match direction {
        Direction::Push(local, shared) => dsec_image::shared::push_image(local, shared, &reference, &bars),
        Direction::Fetch(shared, local) => dsec_image::shared::fetch_image(shared, local, &reference, &bars),
    };
    match result {
        Ok(s) => {
            bars.finish(format!("{} layers copied ({}), {} already there", s.layers_copied, human_bytes(s.bytes_copied), s.layers_present));
            Ok(0)
        }
        Err(e) => {
            bars.bar.abandon_with_message("failed");
            Err(e.into())
        }
    }
}

/// `DSEC_REGISTRY_USER` and `DSEC_REGISTRY_PASSWORD`, when both are set.
fn registry_credentials() -> Option<(String, String)> {
    match (std::env::var("DSEC_REGISTRY_USER"), std::env::var("DSEC_REGISTRY_PASSWORD")) {
        (Ok(u), Ok(p)) => Some((u, p)),
        _ => None,
    }
}

/// Pushes one image to an OCI registry under a progress bar; prints the
/// pushed reference with its manifest digest.
fn push_to_registry(store: &ImageStore, name: &str, destination: &str, options: &RegistryOptions) -> anyhow::Result<u8> {
    let bars = Bars::new(name);
    let started = std::time::Instant::now();
    match push(store, name, destination, options, &bars) {
        Ok(p) => {
            bars.finish(format!(
                "pushed {} layers ({}), {} already there, in {:.1?}",
                p.layers_uploaded,
                human_bytes(p.bytes_uploaded),
                p.layers_present,
                started.elapsed()
            ));
            println!("{}", p.pushed);
            Ok(0)
        }
        Err(e) => {
            bars.bar.abandon_with_message("failed");
            Err(e.into())
        }
    }
}

/// Runs an import or pull under a progress bar and reports the result.
fn finish_import(
    label: &str,
    run: impl FnOnce(&Bars) -> Result<dsec_image::oci::Imported, dsec_image::oci::ImportError>,
) -> anyhow::Result<u8> {
    let bars = Bars::new(label);
    let started = std::time::Instant::now();
    match run(&bars) {
        Ok(done) => {
            let size: u64 = done.image.layers.iter().map(|l| l.size).sum();
            bars.finish(format!(
                "imported {} ({} OCI layers -> {} layers, {}) in {:.1?}",
                done.reference,
                done.source_layers,
                done.image.layers.len(),
                human_bytes(size),
                started.elapsed()
            ));
            println!("{}", done.reference);
            Ok(0)
        }
        Err(e) => {
            bars.bar.abandon_with_message("failed");
            Err(e.into())
        }
    }
}

fn parse_reference(s: &str) -> anyhow::Result<Reference> {
    let (name, tag) = s.split_once(':').unwrap_or((s, dsec_image::DEFAULT_TAG));
    Ok(Reference::new(name, tag)?)
}

fn setup(a: SetupArgs) -> anyhow::Result<u8> {
    let store = a.store.open()?;
    for which in DefaultImage::ALL {
        if !a.only.is_empty() && !a.only.iter().any(|o| o == which.name()) {
            continue;
        }
        match find_default_image(&store, which)? {
            Found::Current => {
                eprintln!("image {} is ready (cached)", which.name());
                continue;
            }
            Found::Outdated => eprintln!("image {} was built from an older recipe: rebuilding it", which.name()),
            Found::Unrecorded => {
                eprintln!("{}", unrecorded_hint(which));
                continue;
            }
            Found::Absent => {}
        }
        let bars = Bars::new(which.name());
        let started = std::time::Instant::now();
        match build_default_image(&store, which, &bars, &a.mirror) {
            Ok(_) => bars.finish(format!("built in {:.1?}", started.elapsed())),
            Err(e) => {
                bars.bar.abandon_with_message("failed");
                return Err(anyhow::anyhow!("building image {}: {e}", which.name()));
            }
        }
    }
    if a.only.is_empty() || a.only.iter().any(|o| o == VM_KERNEL) {
        setup_vm_kernel(&a.store.dir())?;
    }
    if a.only.is_empty() || a.only.iter().any(|o| o == dsec_image::vm::base_image::BASE_IMAGE) {
        setup_base_vm_image(&a.store.dir(), &a.mirror)?;
    }
    Ok(0)
}

/// The guest agent setup puts into VM images: `DSEC_AGENT`, else the one
/// next to this binary.
fn agent_path() -> Option<PathBuf> {
    std::env::var_os("DSEC_AGENT").map(PathBuf::from).or_else(|| std::env::current_exe().ok().map(|e| e.with_file_name("dsec-agent")))
}

/// Builds the full VM's base image `debian-vm` (cached: the debootstrap
/// tree once, the disk again only when the agent changed).
fn setup_base_vm_image(images_dir: &Path, mirror: &str) -> anyhow::Result<()> {
    use dsec_image::vm::base_image::{ensure_base_image, BASE_IMAGE};
    let bars = Bars::new(BASE_IMAGE);
    let started = std::time::Instant::now();
    let agent = agent_path()
        .filter(|a| a.is_file())
        .ok_or_else(|| anyhow::anyhow!("building {BASE_IMAGE}: no guest agent (set DSEC_AGENT or run scripts/build-agent.sh)"))?;
    match ensure_base_image(&dsec_image::vm::vm_dir(images_dir), &agent, mirror, &bars) {
        Ok(path) => {
            bars.finish(format!("{} ready in {:.1?}", path.display(), started.elapsed()));
            Ok(())
        }
        Err(e) => {
            bars.bar.abandon_with_message("failed");
            Err(anyhow::anyhow!("building the VM image {BASE_IMAGE}: {e}"))
        }
    }
}

fn import_vm(name: &str, disk: &Path, store: &StoreArgs) -> anyhow::Result<u8> {
    let bars = Bars::new(name);
    let dir = dsec_image::vm::base_image::images_dir(&dsec_image::vm::vm_dir(&store.dir()));
    match dsec_image::vm::base_image::import_image(&dir, name, disk, &bars) {
        Ok(path) => {
            bars.finish(format!("{}", path.display()));
            Ok(0)
        }
        Err(e) => {
            bars.bar.abandon_with_message("failed");
            Err(e.into())
        }
    }
}

/// `--only` name of the microVM guest kernel.
const VM_KERNEL: &str = "vm-kernel";

/// Fetches the microVM kernel (cached) and builds the initramfs for the
/// agent next to this binary, so a first microVM starts without waiting.
fn setup_vm_kernel(images_dir: &Path) -> anyhow::Result<()> {
    let vm_dir = dsec_image::vm::vm_dir(images_dir);
    let bars = Bars::new(VM_KERNEL);
    let started = std::time::Instant::now();
    let kernel = match dsec_image::vm::ensure_kernel(&vm_dir, dsec_image::vm::KERNEL_PACKAGE, &bars) {
        Ok(k) => k,
        Err(e) => {
            bars.bar.abandon_with_message("failed");
            return Err(anyhow::anyhow!("fetching the microVM kernel: {e}"));
        }
    };
    let agent = agent_path();
    // The initramfs is a convenience here (the edge builds its own for the
    // agent it runs): a missing or dynamically linked agent is only noted.
    let initrd = agent
        .filter(|a| a.is_file())
        .ok_or_else(|| "no guest agent found".to_string())
        .and_then(|agent| dsec_image::vm::build_initramfs(&kernel, &agent, &vm_dir).map_err(|e| e.to_string()));
    match initrd {
        Ok(initrd) => bars.finish(format!("kernel {} and {} ready in {:.1?}", kernel.version, initrd.display(), started.elapsed())),
        Err(why) => bars.finish(format!("kernel {} ready in {:.1?} (no initramfs yet: {why})", kernel.version, started.elapsed())),
    }
    Ok(())
}

/// The image store as the API lists it.
pub struct Catalog {
    store: ImageStore,
}

impl Catalog {
    pub fn open(dir: &Path) -> anyhow::Result<Catalog> {
        Ok(Catalog { store: ImageStore::open(dir)? })
    }

    fn infos(store: &ImageStore) -> anyhow::Result<Vec<ImageInfo>> {
        let mut out: Vec<ImageInfo> = store
            .list()?
            .into_iter()
            .filter(|e| !dsec_build::is_cache_image(&e.reference.to_string()))
            .map(|e| ImageInfo {
                name: e.reference.to_string(),
                layers: e.manifest.layers.iter().map(|l| format!("sha256:{}", l.digest.hex())).collect(),
                size_bytes: e.manifest.size_bytes,
                created_at: e.manifest.created_at.clone(),
                env: e.manifest.config.env.clone(),
                workdir: e.manifest.config.workdir.clone(),
                user: e.manifest.config.user.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

impl dsec_apiserver::ImageCatalog for Catalog {
    fn list(&self) -> Result<Vec<ImageInfo>, String> {
        Catalog::infos(&self.store).map_err(|e| e.to_string())
    }

    fn remove(&self, reference: &str) -> Result<bool, String> {
        match self.store.remove(reference) {
            Ok(()) => Ok(true),
            Err(dsec_image::ImageError::ImageNotFound(_)) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Where an `s3://` shared store is served (credentials come from the
/// usual `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`).
#[derive(Args, Debug, Clone, Default)]
pub struct S3Args {
    /// S3-compatible endpoint, `http(s)://host[:port]` (default: AWS's).
    #[arg(long, env = "DSEC_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Region the requests are signed for (default: $AWS_REGION, else us-east-1).
    #[arg(long)]
    pub s3_region: Option<String>,
}

impl S3Args {
    pub fn options(&self) -> S3Options {
        let mut o = S3Options::from_env();
        if let Some(e) = &self.s3_endpoint {
            o.endpoint = Some(e.clone());
        }
        if let Some(r) = &self.s3_region {
            o.region = r.clone();
        }
        o
    }
}
