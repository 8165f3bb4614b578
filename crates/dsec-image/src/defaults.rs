//! The named images platform setup creates: `busybox`, `python`, and
//! `judge` (the FnCall runners' image).

use std::sync::Arc;

use crate::build::{
    build_image, build_layer_busybox, build_layer_debootstrap, BuildError, BuildOptions,
    BusyboxRecipe, DebootstrapRecipe,
};
use crate::manifest::{ImageConfig, LayerKind};
use crate::progress::Progress;
use crate::reference::Reference;
use crate::store::{ImageError, ImageStore, ResolvedImage};

/// Packages of the `python` image on top of Debian minbase. ca-certificates
/// is there so `git clone https://...` and pip work against real hosts.
pub const PYTHON_PACKAGES: &[&str] = &[
    "python3",
    "python3-pip",
    "python3-venv",
    "git",
    "python3-pytest",
    "ca-certificates",
];
pub const PYTHON_SUITE: &str = "bookworm";

/// Packages of the `judge` image (FnCall runners): the interpreters and
/// compilers of the languages FnCall serves (python, bash, c, cpp).
pub const JUDGE_PACKAGES: &[&str] = &["python3", "gcc", "g++", "libc6-dev"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefaultImage {
    Busybox,
    Python,
    Judge,
}

impl DefaultImage {
    pub const ALL: [DefaultImage; 3] = [DefaultImage::Busybox, DefaultImage::Python, DefaultImage::Judge];

    pub fn name(self) -> &'static str {
        match self {
            DefaultImage::Busybox => "busybox",
            DefaultImage::Python => "python",
            DefaultImage::Judge => "judge",
        }
    }

    pub fn from_name(name: &str) -> Option<DefaultImage> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// `<name>:latest`.
    pub fn reference(self) -> Reference {
        Reference::new(self.name(), crate::reference::DEFAULT_TAG)
            .expect("default image names are valid references")
    }

    fn config(self) -> ImageConfig {
        let mut config = ImageConfig::default();
        if self == DefaultImage::Python {
            // Debian marks its Python "externally managed" (PEP 668), so a
            // bare `pip install` fails. A sandbox is disposable: let agents
            // install into the system Python as they would on a dev box.
            config.env.push("PIP_BREAK_SYSTEM_PACKAGES=1".to_string());
        }
        config
    }
}

/// Whether [`ensure_default_images`] had to build an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    AlreadyPresent,
    Built,
}

/// Builds `which` (replacing any existing image of that name) with the
/// default build options. `mirror` is the Debian mirror of the debootstrap
/// images.
pub fn build_default_image(
    store: &ImageStore,
    which: DefaultImage,
    progress: &dyn Progress,
    mirror: &str,
) -> Result<Arc<ResolvedImage>, BuildError> {
    let options = BuildOptions::default();
    progress.stage(&format!("building image `{}`", which.name()));
    build_image(
        store,
        &which.reference(),
        LayerKind::Base,
        which.config(),
        || match which {
            DefaultImage::Busybox => {
                build_layer_busybox(store, &BusyboxRecipe::default(), &options, progress)
            }
            DefaultImage::Python | DefaultImage::Judge => {
                let packages = if which == DefaultImage::Python { PYTHON_PACKAGES } else { JUDGE_PACKAGES };
                let mut recipe = DebootstrapRecipe::new(PYTHON_SUITE);
                recipe.mirror = mirror.to_string();
                recipe.include = packages.iter().map(|p| p.to_string()).collect();
                build_layer_debootstrap(store, &recipe, &options, progress)
            }
        },
    )
}

/// Builds each default image that is absent (or whose manifest or blobs are
/// damaged); images that resolve are left alone, so a second setup costs a
/// few stats.
pub fn ensure_default_images(
    store: &ImageStore,
    progress: &dyn Progress,
    mirror: &str,
) -> Result<Vec<(DefaultImage, Ensured)>, BuildError> {
    let mut out = Vec::new();
    for which in DefaultImage::ALL {
        let present = match store.resolve_ref(&which.reference()) {
            Ok(_) => true,
            Err(
                ImageError::ImageNotFound(_)
                | ImageError::MissingBlob { .. }
                | ImageError::BlobSizeMismatch { .. }
                | ImageError::Manifest { .. },
            ) => false,
            Err(e) => return Err(e.into()),
        };
        if present {
            progress.stage(&format!("image `{}` already present", which.name()));
            out.push((which, Ensured::AlreadyPresent));
        } else {
            build_default_image(store, which, progress, mirror)?;
            out.push((which, Ensured::Built));
        }
    }
    Ok(out)
}
