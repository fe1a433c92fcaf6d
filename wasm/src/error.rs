//! Errors as JavaScript sees them: an `Error` whose `code` is the engine's stable code
//! ([`colibri_engine::Error::code`], the same as the helper's HTTP error bodies) and, for a
//! request parameter, whose `param` names it; the worker and `colibri.js` pass both on,
//! so that no caller matches on a message's text.

use wasm_bindgen::prelude::*;

/// A JavaScript `Error` with `code` (and `param`) set where the error has them.
pub struct JsFail(JsValue);

impl JsFail {
    /// An error with `message` alone (no code): the browser's I/O, the engine being busy.
    pub fn msg(message: &str) -> Self {
        JsFail::new(message, None, None)
    }

    pub fn new(message: &str, code: Option<&str>, param: Option<&str>) -> Self {
        let e: JsValue = js_sys::Error::new(message).into();
        // Setting a property on a fresh Error object cannot fail.
        if let Some(c) = code {
            let _ = js_sys::Reflect::set(&e, &"code".into(), &c.into());
        }
        if let Some(p) = param {
            let _ = js_sys::Reflect::set(&e, &"param".into(), &p.into());
        }
        JsFail(e)
    }
}

impl From<JsFail> for JsValue {
    fn from(e: JsFail) -> JsValue {
        e.0
    }
}

/// wasm-bindgen's own errors (no code).
impl From<JsError> for JsFail {
    fn from(e: JsError) -> JsFail {
        JsFail(e.into())
    }
}

impl From<colibri_engine::Error> for JsFail {
    fn from(e: colibri_engine::Error) -> JsFail {
        JsFail::new(&e.to_string(), Some(e.code()), e.param_name())
    }
}

/// What can become a [`JsFail`]: the engine's errors with their code, anything else
/// (a browser API's message) without.
pub trait Coded: std::fmt::Display {
    fn into_fail(self) -> JsFail
    where
        Self: Sized,
    {
        JsFail::new(&self.to_string(), None, None)
    }
}

impl Coded for colibri_engine::Error {
    fn into_fail(self) -> JsFail {
        self.into()
    }
}
impl Coded for String {}
impl Coded for &str {}
impl Coded for serde_json::Error {}

/// `e` as a JavaScript error.
pub fn err(e: impl Coded) -> JsFail {
    e.into_fail()
}
