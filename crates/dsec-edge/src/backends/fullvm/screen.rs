//! A full VM's screen as PNG: QMP `screendump` into the VM's run
//! directory, read back and removed.
//!
//! QEMU 7.1 and later write PNG themselves (`format: "png"`); an older
//! QEMU refuses the argument and writes PPM, which is converted here with
//! the `png` crate. The PPM header also gives the screen's size, which
//! pointer positions are scaled by.

use std::path::Path;

use serde_json::json;

use crate::backends::qemu::qmp::{self, QmpError};
use crate::backends::Screenshot;
use crate::error::EdgeError;

/// Takes a screenshot of the VM whose QMP socket is `socket`, using `dir`
/// for the moment the file exists.
pub async fn capture(socket: &Path, dir: &Path) -> Result<Screenshot, EdgeError> {
    let file = dir.join(format!("screen-{}.img", rand::random::<u64>()));
    let name = file.to_str().ok_or(ScreenError::NonUtf8Path)?.to_string();
    let png = qmp::execute_with(socket, "screendump", json!({"filename": name, "format": "png"})).await;
    let result = match png {
        Ok(_) => read(&file).and_then(|png| {
            let (width, height) = png_size(&png).ok_or(ScreenError::BadPng)?;
            Ok(Screenshot { png, width, height })
        }),
        // An older QEMU: no format argument, PPM only.
        Err(QmpError::Failed { error, .. }) if error.to_string().contains("format") => {
            qmp::execute_with(socket, "screendump", json!({"filename": name})).await?;
            read(&file).and_then(|ppm| Ok(ppm_to_png(&ppm)?))
        }
        Err(e) => Err(e.into()),
    };
    let _ = std::fs::remove_file(&file);
    result
}

fn read(file: &Path) -> Result<Vec<u8>, EdgeError> {
    std::fs::read(file).map_err(EdgeError::io("reading the screendump", file))
}

/// Why a screendump could not be taken or read.
#[derive(Debug, thiserror::Error)]
pub enum ScreenError {
    #[error("the run directory's path is not UTF-8")]
    NonUtf8Path,
    #[error("QEMU wrote an invalid PNG")]
    BadPng,
    #[error("QEMU wrote an invalid PPM: {0}")]
    BadPpm(String),
    #[error("encoding the screen as PNG: {0}")]
    Encode(#[from] png::EncodingError),
}

impl From<ScreenError> for EdgeError {
    fn from(e: ScreenError) -> EdgeError {
        EdgeError::Screen(Box::new(e))
    }
}

/// Width and height from a PNG's IHDR chunk.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(png[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(png[20..24].try_into().ok()?);
    Some((w, h))
}

/// Parses a binary PPM (P6, maxval 255: what QEMU writes).
pub fn parse_ppm(ppm: &[u8]) -> Result<(u32, u32, &[u8]), ScreenError> {
    let bad = ScreenError::BadPpm;
    // Header: "P6" whitespace width whitespace height whitespace maxval
    // one whitespace byte, then the pixels. Comments (#...) may appear.
    let mut fields = Vec::with_capacity(4);
    let mut i = 0;
    while fields.len() < 4 {
        while i < ppm.len() && (ppm[i].is_ascii_whitespace() || ppm[i] == b'#') {
            if ppm[i] == b'#' {
                while i < ppm.len() && ppm[i] != b'\n' {
                    i += 1;
                }
            } else {
                i += 1;
            }
        }
        let start = i;
        while i < ppm.len() && !ppm[i].is_ascii_whitespace() {
            i += 1;
        }
        if start == i {
            return Err(bad("truncated header".into()));
        }
        fields.push(std::str::from_utf8(&ppm[start..i]).map_err(|_| bad("a header field is not text".into()))?);
    }
    if fields[0] != "P6" {
        return Err(bad(format!("not a binary PPM (magic {:?})", fields[0])));
    }
    let num = |s: &str| s.parse::<u32>().map_err(|_| bad(format!("bad number {s:?}")));
    let (w, h, max) = (num(fields[1])?, num(fields[2])?, num(fields[3])?);
    if max != 255 {
        return Err(bad(format!("maxval {max} (only 255 is supported)")));
    }
    let pixels = &ppm[(i + 1).min(ppm.len())..];
    let want = (w as usize).checked_mul(h as usize).and_then(|n| n.checked_mul(3)).ok_or_else(|| bad("too large".into()))?;
    if w == 0 || h == 0 || pixels.len() < want {
        return Err(bad(format!("{w}x{h} with {} bytes of pixels", pixels.len())));
    }
    Ok((w, h, &pixels[..want]))
}

/// PPM to PNG (RGB, 8 bits, fast compression: a screen is mostly flat).
pub fn ppm_to_png(ppm: &[u8]) -> Result<Screenshot, ScreenError> {
    let (width, height, pixels) = parse_ppm(ppm)?;
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_compression(png::Compression::Fast);
        let mut w = enc.write_header()?;
        w.write_image_data(pixels)?;
    }
    Ok(Screenshot { png: out, width, height })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ppm(w: u32, h: u32, px: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
        let mut v = format!("P6\n# a comment\n{w} {h}\n255\n").into_bytes();
        for y in 0..h {
            for x in 0..w {
                v.extend(px(x, y));
            }
        }
        v
    }

    #[test]
    fn a_ppm_becomes_a_png_with_the_same_pixels() {
        let src = ppm(7, 3, |x, y| [x as u8 * 30, y as u8 * 80, 200]);
        let shot = ppm_to_png(&src).unwrap();
        assert_eq!((shot.width, shot.height), (7, 3));
        assert_eq!(png_size(&shot.png), Some((7, 3)));
        let dec = png::Decoder::new(std::io::Cursor::new(&shot.png));
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(&buf[..info.buffer_size()], parse_ppm(&src).unwrap().2);
    }

    #[test]
    fn bad_ppms_are_refused() {
        assert!(parse_ppm(b"P5\n1 1\n255\n\0").is_err(), "greyscale");
        assert!(parse_ppm(b"P6\n2 2\n255\n\0\0\0").is_err(), "short pixels");
        assert!(parse_ppm(b"P6\n2 2\n65535\n").is_err(), "16-bit");
        assert!(parse_ppm(b"P6\n").is_err(), "truncated");
        assert!(parse_ppm(b"P6\n0 0\n255\n").is_err(), "empty");
        assert!(png_size(b"not a png at all, really not").is_none());
    }
}
