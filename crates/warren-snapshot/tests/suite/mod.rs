mod engine;
mod stores;
