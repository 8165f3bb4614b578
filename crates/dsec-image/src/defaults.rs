//! The named images platform setup creates: `busybox`, `python`, and
//! `judge` (the FnCall runners' image).

use std::sync::Arc;

use crate::build::{
    archive_java_classes, build_image_from_recipe, build_layer_busybox, build_layer_debootstrap_then, precompile_stdcpp, BuildError,
    BuildOptions, BusyboxRecipe, DebootstrapRecipe,
};
use crate::manifest::{ImageConfig, LayerKind, Manifest};
use crate::progress::Progress;
use crate::reference::Reference;
use crate::store::{ImageError, ImageStore, ResolvedImage};

/// Packages of the `python` image on top of Debian minbase. ca-certificates
/// is there so `git clone https://...` and pip work against real hosts.
pub const PYTHON_PACKAGES: &[&str] = &["python3", "python3-pip", "python3-venv", "git", "python3-pytest", "ca-certificates"];
pub const PYTHON_SUITE: &str = "bookworm";

/// Packages of the `judge` image (FnCall runners): the interpreters and
/// compilers of the languages FnCall serves (python, bash, c, cpp, java,
/// javascript, go, rust, php, ruby, perl, lua). The image also carries `<bits/stdc++.h>` precompiled
/// (`build::pch`) and class-data-sharing archives for javac and Java
/// programs (`build::java_cds`).
pub const JUDGE_PACKAGES: &[&str] =
    &["python3", "gcc", "g++", "libc6-dev", "openjdk-17-jdk-headless", "nodejs", "golang-go", "rustc", "php-cli", "ruby", "perl", "lua5.4"];

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

    /// The version of the recipe this build of dsec makes the image from.
    /// Raise it when the image's content changes, and setup rebuilds the
    /// images it made from an older one. `judge`: 2 added the precompiled
    /// `<bits/stdc++.h>`, 3 a JDK, Node.js and Go, 4 Rust, PHP, Ruby, Perl
    /// and Lua. Images from before versions were recorded count
    /// as version 1 only where that is still the version: otherwise
    /// nothing tells them from an image a user built under that name.
    pub fn recipe_version(self) -> u32 {
        match self {
            DefaultImage::Busybox | DefaultImage::Python => 1,
            DefaultImage::Judge => 4,
        }
    }

    /// `<name>:latest`.
    pub fn reference(self) -> Reference {
        Reference::new(self.name(), crate::reference::DEFAULT_TAG).expect("default image names are valid references")
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
    build_image_from_recipe(store, &which.reference(), LayerKind::Base, which.config(), Some(which.recipe_version()), || match which {
        DefaultImage::Busybox => build_layer_busybox(store, &BusyboxRecipe::default(), &options, progress),
        DefaultImage::Python | DefaultImage::Judge => {
            let packages = if which == DefaultImage::Python { PYTHON_PACKAGES } else { JUDGE_PACKAGES };
            let mut recipe = DebootstrapRecipe::new(PYTHON_SUITE);
            recipe.mirror = mirror.to_string();
            recipe.include = packages.iter().map(|p| p.to_string()).collect();
            build_layer_debootstrap_then(store, &recipe, &options, progress, |root| {
                if which == DefaultImage::Judge {
                    precompile_stdcpp(root, progress)?;
                    archive_java_classes(root, progress)
                } else {
                    Ok(())
                }
            })
        }
    })
}

/// Builds each default image that is absent (or whose manifest or blobs are
/// damaged), or was built from an older recipe; images that resolve and
/// are current are left alone, so a second setup costs a few stats.
pub fn ensure_default_images(
    store: &ImageStore,
    progress: &dyn Progress,
    mirror: &str,
) -> Result<Vec<(DefaultImage, Ensured)>, BuildError> {
    let mut out = Vec::new();
    for which in DefaultImage::ALL {
        match find_default_image(store, which)? {
            Found::Current => {
                progress.stage(&format!("image `{}` already present", which.name()));
                out.push((which, Ensured::AlreadyPresent));
                continue;
            }
            Found::Outdated => progress.stage(&format!("image `{}` was built from an older recipe: rebuilding it", which.name())),
            Found::Unrecorded => {
                progress.stage(&unrecorded_hint(which));
                out.push((which, Ensured::AlreadyPresent));
                continue;
            }
            Found::Absent => {}
        }
        build_default_image(store, which, progress, mirror)?;
        out.push((which, Ensured::Built));
    }
    Ok(out)
}

/// What a store holds of a default image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Present, whole, and built from this dsec's recipe.
    Current,
    /// Present, but built from an older recipe: setup rebuilds it.
    Outdated,
    /// Present and whole, with no recipe version, where this dsec's recipe
    /// is not the first: made by a dsec from before versions were recorded,
    /// or by a user under that name. Setup keeps it ([`unrecorded_hint`]).
    Unrecorded,
    /// Absent, or its manifest or a layer is damaged.
    Absent,
}

/// Looks `which` up in `store` (what setup would do about it).
pub fn find_default_image(store: &ImageStore, which: DefaultImage) -> Result<Found, ImageError> {
    match store.resolve_ref(&which.reference()) {
        Ok(image) => Ok(state_of(which, &image.manifest)),
        Err(
            ImageError::ImageNotFound(_)
            | ImageError::MissingBlob { .. }
            | ImageError::BlobSizeMismatch { .. }
            | ImageError::Manifest { .. },
        ) => Ok(Found::Absent),
        Err(e) => Err(e),
    }
}

/// What setup makes of `manifest`, an image named as `which`. One a later
/// dsec built is kept.
fn state_of(which: DefaultImage, manifest: &Manifest) -> Found {
    match manifest.default_recipe {
        Some(v) if v >= which.recipe_version() => Found::Current,
        Some(_) => Found::Outdated,
        None if which.recipe_version() == 1 => Found::Current,
        None => Found::Unrecorded,
    }
}

/// What setup says of a [`Found::Unrecorded`] image it keeps.
pub fn unrecorded_hint(which: DefaultImage) -> String {
    let what = match which {
        DefaultImage::Judge => " (which precompiles <bits/stdc++.h>)",
        DefaultImage::Busybox | DefaultImage::Python => "",
    };
    format!(
        "image `{name}` records no recipe version: built by an older dsec or by hand, so it is kept; \
         `dsec image rm {name}` then `dsec image setup` builds it from the current recipe{what}",
        name = which.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built_from(version: Option<u32>) -> Manifest {
        let layer = crate::manifest::LayerDescriptor { digest: crate::digest::Digest::of_bytes(b"layer"), kind: LayerKind::Base, size: 10 };
        let mut m = Manifest::new(vec![layer], ImageConfig::default());
        m.default_recipe = version;
        m
    }

    #[test]
    fn only_an_image_setup_made_from_an_older_recipe_is_rebuilt() {
        let v = DefaultImage::Judge.recipe_version();
        assert!(v > 1);
        assert_eq!(state_of(DefaultImage::Judge, &built_from(Some(v))), Found::Current);
        assert_eq!(state_of(DefaultImage::Judge, &built_from(Some(v - 1))), Found::Outdated);
        // One a later dsec built is kept.
        assert_eq!(state_of(DefaultImage::Judge, &built_from(Some(v + 1))), Found::Current);
        // Without a version: an older dsec's, or a user's own `judge`;
        // kept either way, never overwritten.
        assert_eq!(state_of(DefaultImage::Judge, &built_from(None)), Found::Unrecorded);
        assert!(unrecorded_hint(DefaultImage::Judge).contains("dsec image rm judge"));
        // Where the recipe is still the first, such an image is current.
        assert_eq!(state_of(DefaultImage::Python, &built_from(None)), Found::Current);
        assert_eq!(state_of(DefaultImage::Busybox, &built_from(None)), Found::Current);
    }

    #[test]
    fn the_recipe_version_survives_the_manifest_round_trip() {
        let m = built_from(Some(2));
        let back = Manifest::from_json(&m.to_json().unwrap()).unwrap();
        assert_eq!(back.default_recipe, Some(2));
        // Left out when absent, so manifests of other images are unchanged.
        let plain = String::from_utf8(built_from(None).to_json().unwrap()).unwrap();
        assert!(!plain.contains("default_recipe"), "{plain}");
    }
}
