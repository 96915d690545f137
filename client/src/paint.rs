//! Drawing on animation frames, one JS crossing per widget per frame.
//!
//! Streaming widgets (books, charts) never touch the DOM when a message arrives: they update their
//! state in Rust and ask for a frame with [`request`]. On the next animation frame every widget
//! that asked is drawn once, through one call into `web/paint.js` (the glue that puts prepared
//! text and numbers into the DOM or the chart library). However many messages arrived in between,
//! a widget costs one crossing per frame; a quiet widget costs none.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use wasm_bindgen::prelude::*;
use web_sys::Element;

#[wasm_bindgen(module = "/web/paint.js")]
extern "C" {
    /// Draws a book card's body (see `paint.js` for the tab-separated layout of `text`).
    pub fn paint_book(el: &Element, levels: u32, text: &str);
    /// Draws candles: 6 numbers per candle (open time in s, o, h, l, c, volume).
    pub fn paint_chart(
        el: &Element,
        reset: bool,
        data: &[f64],
        decimals: u32,
        count: u32,
        status: &str,
    );
    /// Removes a chart.
    pub fn drop_chart(el: &Element);
}

/// Something drawn on animation frames.
pub trait Paint {
    fn paint(&self);
}

thread_local! {
    static QUEUE: RefCell<Vec<Weak<dyn Paint>>> = const { RefCell::new(Vec::new()) };
    static SCHEDULED: Cell<bool> = const { Cell::new(false) };
}

/// A widget's place in the frame queue: asks at most once per frame.
#[derive(Default)]
pub struct FrameSlot {
    queued: Cell<bool>,
}

impl FrameSlot {
    /// Queues `widget` for the next frame unless it is queued already.
    pub fn request<W: Paint + 'static>(&self, widget: &Rc<W>) {
        if self.queued.replace(true) {
            return;
        }
        let weak: Weak<dyn Paint> = Rc::downgrade(widget) as Weak<dyn Paint>;
        QUEUE.with(|q| q.borrow_mut().push(weak));
        if !SCHEDULED.with(|s| s.replace(true)) {
            leptos::prelude::request_animation_frame(run_frame);
        }
    }

    /// Call first thing in [`Paint::paint`]: the widget may ask again from now on.
    pub fn painted(&self) {
        self.queued.set(false);
    }
}

fn run_frame() {
    SCHEDULED.with(|s| s.set(false));
    let due = QUEUE.with(|q| std::mem::take(&mut *q.borrow_mut()));
    for widget in due {
        // a widget unmounted since it asked is gone: nothing to draw
        if let Some(w) = widget.upgrade() {
            w.paint();
        }
    }
}
