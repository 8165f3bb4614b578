//! Keyboard and mouse input for a full VM's screen, as QMP
//! `input-send-event` batches.
//!
//! Keys are named as xdotool and QEMU's own `sendkey` name them: a combo is
//! `ctrl-alt-delete` or `ctrl+c` (modifiers first), each part a QEMU
//! "qcode" (`a`, `ret`, `esc`, `f1`, `kp_add`...) or a common alias
//! (`enter`, `escape`, `control`, `super`...). Text is typed character by
//! character on a US layout (shift for capitals and symbols). Pointer
//! positions are screen pixels, scaled to the absolute axis of the VM's
//! tablet (0..=32767).
//!
//! Pure: names in, JSON events out; the QMP call is the caller's.

use serde_json::{json, Value};

use crate::backends::ScreenInput;

/// The longest key list or text accepted at once (each character is two
/// events; QEMU queues them all).
pub const MAX_KEYS: usize = 256;
pub const MAX_TEXT: usize = 4096;
/// The tablet's absolute axis range.
const ABS_MAX: u32 = 0x7fff;

/// The events of `action`, but for a pointer's move (which needs the
/// screen's size: [`move_events`]); checked whatever the VM's state.
pub fn events(action: &ScreenInput) -> Result<Vec<Value>, String> {
    match action {
        ScreenInput::Keys(keys) => {
            if keys.is_empty() || keys.len() > MAX_KEYS {
                return Err(format!("keys must name 1 to {MAX_KEYS} key combos"));
            }
            let combos = keys.iter().map(|k| parse_combo(k)).collect::<Result<Vec<_>, _>>()?;
            Ok(combos.iter().flat_map(combo_events).collect())
        }
        ScreenInput::Text(text) => {
            if text.is_empty() {
                return Err("text must not be empty".into());
            }
            text_events(text)
        }
        ScreenInput::Move { .. } => Ok(Vec::new()),
        ScreenInput::Click { button: b, double, .. } => Ok(click_events(button(b)?, *double)),
    }
}

/// Where `action` moves the pointer first, if anywhere.
pub fn target(action: &ScreenInput) -> Option<(u32, u32)> {
    match action {
        ScreenInput::Move { x, y } => Some((*x, *y)),
        ScreenInput::Click { at, .. } => *at,
        _ => None,
    }
}

/// One press-and-release of a combo, in QMP events.
#[derive(Debug, Clone, PartialEq)]
pub struct Combo(Vec<String>);

/// Parses `ctrl-alt-delete`, `ctrl+c`, `a`, `-` (the minus key), `+` (the
/// keypad's plus) into qcodes.
pub fn parse_combo(spec: &str) -> Result<Combo, String> {
    let s = spec.trim();
    if s.is_empty() {
        return Err("an empty key name".into());
    }
    // A lone separator is the key itself.
    let parts: Vec<&str> = if s == "-" || s == "+" { vec![s] } else { s.split(['-', '+']).collect() };
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("key {spec:?}: empty part (write ctrl-minus for the minus key)"));
    }
    let codes = parts.iter().map(|p| qcode(p).ok_or_else(|| format!("unknown key {p:?} in {spec:?}"))).collect::<Result<Vec<_>, _>>()?;
    Ok(Combo(codes))
}

/// A QEMU qcode for a key name or alias.
fn qcode(name: &str) -> Option<String> {
    let n = name.to_ascii_lowercase();
    let alias = match n.as_str() {
        "enter" | "return" => "ret",
        "escape" => "esc",
        "control" | "ctl" | "ctrl_l" | "control_l" => "ctrl",
        "ctrl_r" | "control_r" => "ctrl_r",
        "shift_l" => "shift",
        "alt_l" => "alt",
        "super" | "win" | "meta" | "cmd" | "super_l" => "meta_l",
        "super_r" => "meta_r",
        "del" => "delete",
        "ins" => "insert",
        "pageup" | "page_up" | "prior" => "pgup",
        "pagedown" | "page_down" | "next" => "pgdn",
        "backspace" | "back_space" | "bksp" => "backspace",
        "space" | " " => "spc",
        "minus" | "-" => "minus",
        "plus" | "+" => "kp_add",
        "left" | "right" | "up" | "down" | "home" | "end" | "tab" | "menu" | "print" | "pause" => n.as_str(),
        _ => n.as_str(),
    };
    KNOWN.contains(&alias).then(|| alias.to_string())
}

/// QEMU's qcodes a client may send (QAPI `QKeyCode`, minus the rare ones).
const KNOWN: &[&str] = &[
    "shift",
    "shift_r",
    "alt",
    "alt_r",
    "ctrl",
    "ctrl_r",
    "meta_l",
    "meta_r",
    "menu",
    "esc",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "0",
    "minus",
    "equal",
    "backspace",
    "tab",
    "q",
    "w",
    "e",
    "r",
    "t",
    "y",
    "u",
    "i",
    "o",
    "p",
    "bracket_left",
    "bracket_right",
    "ret",
    "a",
    "s",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "semicolon",
    "apostrophe",
    "grave_accent",
    "backslash",
    "z",
    "x",
    "c",
    "v",
    "b",
    "n",
    "m",
    "comma",
    "dot",
    "slash",
    "asterisk",
    "spc",
    "caps_lock",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "f6",
    "f7",
    "f8",
    "f9",
    "f10",
    "f11",
    "f12",
    "num_lock",
    "scroll_lock",
    "kp_divide",
    "kp_multiply",
    "kp_subtract",
    "kp_add",
    "kp_enter",
    "kp_decimal",
    "sysrq",
    "kp_0",
    "kp_1",
    "kp_2",
    "kp_3",
    "kp_4",
    "kp_5",
    "kp_6",
    "kp_7",
    "kp_8",
    "kp_9",
    "print",
    "home",
    "pgup",
    "pgdn",
    "end",
    "left",
    "up",
    "down",
    "right",
    "insert",
    "delete",
    "pause",
];

fn key_event(code: &str, down: bool) -> Value {
    json!({"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": code}}})
}

/// Press every key of the combo in order, release in reverse.
pub fn combo_events(c: &Combo) -> Vec<Value> {
    let mut ev: Vec<Value> = c.0.iter().map(|k| key_event(k, true)).collect();
    ev.extend(c.0.iter().rev().map(|k| key_event(k, false)));
    ev
}

/// The key (and whether shift is held) that types `ch` on a US layout.
fn char_key(ch: char) -> Option<(&'static str, bool)> {
    const PLAIN: &[(char, &str)] = &[
        (' ', "spc"),
        ('\n', "ret"),
        ('\t', "tab"),
        ('-', "minus"),
        ('=', "equal"),
        ('[', "bracket_left"),
        (']', "bracket_right"),
        (';', "semicolon"),
        ('\'', "apostrophe"),
        ('`', "grave_accent"),
        ('\\', "backslash"),
        (',', "comma"),
        ('.', "dot"),
        ('/', "slash"),
    ];
    const SHIFTED: &[(char, &str)] = &[
        ('!', "1"),
        ('@', "2"),
        ('#', "3"),
        ('$', "4"),
        ('%', "5"),
        ('^', "6"),
        ('&', "7"),
        ('*', "8"),
        ('(', "9"),
        (')', "0"),
        ('_', "minus"),
        ('+', "equal"),
        ('{', "bracket_left"),
        ('}', "bracket_right"),
        (':', "semicolon"),
        ('"', "apostrophe"),
        ('~', "grave_accent"),
        ('|', "backslash"),
        ('<', "comma"),
        ('>', "dot"),
        ('?', "slash"),
    ];
    if ch.is_ascii_lowercase() || ch.is_ascii_digit() {
        return KNOWN.iter().find(|k| k.len() == 1 && k.starts_with(ch)).map(|k| (*k, false));
    }
    if ch.is_ascii_uppercase() {
        return char_key(ch.to_ascii_lowercase()).map(|(k, _)| (k, true));
    }
    PLAIN
        .iter()
        .find(|(c, _)| *c == ch)
        .map(|(_, k)| (*k, false))
        .or_else(|| SHIFTED.iter().find(|(c, _)| *c == ch).map(|(_, k)| (*k, true)))
}

/// The events that type `text`; characters a US keyboard cannot type are
/// refused (the caller gets a 400 naming the first one).
pub fn text_events(text: &str) -> Result<Vec<Value>, String> {
    if text.chars().count() > MAX_TEXT {
        return Err(format!("text longer than {MAX_TEXT} characters"));
    }
    let mut ev = Vec::with_capacity(text.len() * 2);
    for ch in text.chars() {
        let (key, shift) = char_key(ch).ok_or_else(|| format!("character {ch:?} cannot be typed on a US keyboard (send it as keys)"))?;
        let combo = if shift { Combo(vec!["shift".into(), key.into()]) } else { Combo(vec![key.into()]) };
        ev.extend(combo_events(&combo));
    }
    Ok(ev)
}

/// Mouse buttons.
pub fn button(name: &str) -> Result<&'static str, String> {
    match name {
        "left" => Ok("left"),
        "right" => Ok("right"),
        "middle" => Ok("middle"),
        other => Err(format!("mouse button must be left, right or middle, not {other:?}")),
    }
}

/// Moves the pointer to pixel (x, y) of a `width`x`height` screen.
pub fn move_events(x: u32, y: u32, width: u32, height: u32) -> Result<Vec<Value>, String> {
    if width == 0 || height == 0 {
        return Err("the screen has no size yet".into());
    }
    if x >= width || y >= height {
        return Err(format!("({x}, {y}) is outside the {width}x{height} screen"));
    }
    let scale = |v: u32, size: u32| -> u64 { (u64::from(v) * u64::from(ABS_MAX)) / u64::from((size - 1).max(1)) };
    Ok(vec![
        json!({"type": "abs", "data": {"axis": "x", "value": scale(x, width)}}),
        json!({"type": "abs", "data": {"axis": "y", "value": scale(y, height)}}),
    ])
}

/// Press and release `button` (twice for a double click).
pub fn click_events(button: &str, double: bool) -> Vec<Value> {
    let btn = |down: bool| json!({"type": "btn", "data": {"down": down, "button": button}});
    let mut ev = vec![btn(true), btn(false)];
    if double {
        ev.extend([btn(true), btn(false)]);
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(events: &[Value]) -> Vec<(bool, String)> {
        events.iter().map(|e| (e["data"]["down"].as_bool().unwrap(), e["data"]["key"]["data"].as_str().unwrap().to_string())).collect()
    }

    #[test]
    fn combos_press_in_order_and_release_in_reverse() {
        let c = parse_combo("ctrl-alt-delete").unwrap();
        let ev = combo_events(&c);
        let expect = [(true, "ctrl"), (true, "alt"), (true, "delete"), (false, "delete"), (false, "alt"), (false, "ctrl")];
        assert_eq!(codes(&ev), expect.map(|(d, k)| (d, k.to_string())));
        assert_eq!(ev[0]["type"], "key");
        assert_eq!(ev[0]["data"]["key"]["type"], "qcode");
        assert_eq!(parse_combo("Ctrl+C").unwrap(), Combo(vec!["ctrl".into(), "c".into()]));
        assert_eq!(parse_combo("Enter").unwrap(), Combo(vec!["ret".into()]));
        assert_eq!(parse_combo("-").unwrap(), Combo(vec!["minus".into()]));
        assert_eq!(parse_combo("super").unwrap(), Combo(vec!["meta_l".into()]));
    }

    #[test]
    fn unknown_or_empty_keys_are_refused() {
        for bad in ["", "ctrl-", "hyper", "ctrl--", "a b"] {
            assert!(parse_combo(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn text_uses_shift_for_capitals_and_symbols() {
        let ev = text_events("aB!\n").unwrap();
        let got = codes(&ev);
        let expect = [
            (true, "a"),
            (false, "a"),
            (true, "shift"),
            (true, "b"),
            (false, "b"),
            (false, "shift"),
            (true, "shift"),
            (true, "1"),
            (false, "1"),
            (false, "shift"),
            (true, "ret"),
            (false, "ret"),
        ];
        assert_eq!(got, expect.map(|(d, k)| (d, k.to_string())));
        assert!(text_events("héllo").unwrap_err().contains("'é'"));
        assert!(text_events(&"x".repeat(MAX_TEXT + 1)).is_err());
        // Every printable ASCII character can be typed.
        for b in 0x20u8..0x7f {
            assert!(text_events(&(b as char).to_string()).is_ok(), "{:?}", b as char);
        }
    }

    #[test]
    fn pointer_positions_scale_to_the_tablet_axis() {
        let ev = move_events(0, 399, 720, 400).unwrap();
        assert_eq!(ev[0]["data"]["value"], 0);
        assert_eq!(ev[1]["data"]["value"], ABS_MAX);
        let mid = move_events(360, 200, 721, 401).unwrap();
        assert_eq!(mid[0]["data"]["value"], u64::from(ABS_MAX) / 2);
        assert!(move_events(720, 0, 720, 400).is_err());
        assert!(move_events(0, 0, 0, 0).is_err());
    }

    #[test]
    fn clicks_and_buttons() {
        assert_eq!(click_events("left", false).len(), 2);
        assert_eq!(click_events("right", true).len(), 4);
        assert_eq!(click_events("left", false)[0]["data"]["button"], "left");
        assert!(button("left").is_ok() && button("wheel").is_err());
    }
}
