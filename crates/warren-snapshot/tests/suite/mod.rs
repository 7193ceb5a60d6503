mod engine;
mod sparse;
mod stores;
