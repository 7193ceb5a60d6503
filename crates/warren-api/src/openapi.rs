//! The OpenAPI 3 document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "warren", description = "Sandboxes and workspaces for AI agents."),
    paths(
        crate::health,
        crate::metrics,
        crate::cluster::get,
        crate::workdirs::create,
        crate::workdirs::list,
        crate::usage::get,
        crate::env::get,
        crate::env::replace,
        crate::env::clear,
        crate::env::set,
        crate::env::remove,
        crate::secrets::of_user,
        crate::secrets::set_for_user,
        crate::secrets::remove_for_user,
        crate::secrets::of_sandbox,
        crate::secrets::set_for_sandbox,
        crate::secrets::remove_for_sandbox,
        crate::secrets::egress,
        crate::sandboxes::create,
        crate::sandboxes::list,
        crate::sandboxes::get,
        crate::sandboxes::delete,
        crate::sandboxes::terminate,
        crate::sandboxes::update,
        crate::sandboxes::pause,
        crate::sandboxes::resume,
        crate::sandboxes::exec,
        crate::sandboxes::kill,
        crate::processes::start,
        crate::processes::list,
        crate::processes::get,
        crate::processes::output,
        crate::processes::stdin,
        crate::processes::close_stdin,
        crate::processes::signal,
        crate::processes::resize,
        crate::processes::kill,
        crate::processes::attach,
        crate::code::create,
        crate::code::list,
        crate::code::get,
        crate::code::remove,
        crate::code::restart,
        crate::code::interrupt,
        crate::code::execute,
        crate::runs::of_sandbox,
        crate::runs::of_user,
        crate::viewer::create_link,
        crate::checkpoints::create,
        crate::checkpoints::list,
        crate::checkpoints::diff,
        crate::checkpoints::restore,
        crate::checkpoints::gc,
        crate::checkpoints::snapshot,
        crate::checkpoints::snapshots,
        crate::sandboxes::fork,
        crate::branches::create,
        crate::branches::list,
        crate::branches::diff,
        crate::branches::delete,
        crate::branches::merge,
        crate::skills::list,
        crate::skills::grant,
        crate::skills::revoke,
        crate::skills::sync,
        crate::artifacts::present,
        crate::artifacts::list,
        crate::artifacts::download,
        crate::guard::acquire,
        crate::guard::get,
        crate::guard::renew,
        crate::guard::release,
        crate::leases::create,
        crate::leases::renew,
        crate::leases::release,
        crate::files::read,
        crate::files::write,
        crate::files::remove,
        crate::files::stat,
        crate::files::list,
        crate::files::edit,
        crate::files::glob,
        crate::files::grep,
        crate::files::mkdir,
        crate::files::rename,
        crate::watch::watch,
    ),
    modifiers(&BearerAuth)
)]
struct WarrenApi;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document of this server: generated from the handlers' annotations, then
/// completed with the answers every operation shares and the rules the server enforces on
/// each value ([`crate::contract`]).
pub fn openapi_document() -> serde_json::Value {
    let mut document =
        serde_json::to_value(WarrenApi::openapi()).expect("the generated document serialises");
    crate::contract::complete(&mut document);
    document
}

/// `GET /v1/openapi.json`: the document, narrowed to what this server is configured to
/// accept (its backends, its host directories).
pub(crate) async fn serve(
    axum::extract::State(state): axum::extract::State<crate::ApiState>,
) -> Json<serde_json::Value> {
    let mut document = openapi_document();
    let backends = state.provisioner.backends();
    let facts = crate::contract::ServerFacts {
        docker: backends.contains(&warren_backend::BackendKind::Docker),
        backends: backends.iter().map(|k| k.as_str().to_owned()).collect(),
        gvisor: backends
            .iter()
            .filter(|k| {
                state
                    .provisioner
                    .backend()
                    .gvisor_unavailable(**k)
                    .is_none()
            })
            .map(|k| k.as_str().to_owned())
            .collect(),
        secret_sources: state
            .provisioner
            .config()
            .secret_sources
            .keys()
            .cloned()
            .collect(),
        host_dirs: state
            .provisioner
            .config()
            .init_host_dirs
            .keys()
            .cloned()
            .collect(),
    };
    crate::contract::describe_server(&mut document, &facts);
    Json(document)
}

#[cfg(test)]
mod tests {
    //! The document's promises that `cargo test` alone can hold it to; scripts/openapi-check
    //! holds the live server to the whole document.

    use serde_json::Value;

    use super::openapi_document;

    fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
        let mut found = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                found.push((method.to_uppercase(), path.clone(), operation));
            }
        }
        found
    }

    #[test]
    fn every_secured_operation_documents_401_as_an_error_body() {
        let doc = openapi_document();
        let mut secured = 0;
        for (method, path, operation) in operations(&doc) {
            if operation["security"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
            {
                secured += 1;
                assert_eq!(
                    operation["responses"]["401"]["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path}"
                );
            }
        }
        assert!(secured >= 42, "only {secured} secured operations");
    }

    #[test]
    fn every_operation_that_writes_a_workspace_documents_507() {
        let doc = openapi_document();
        let mut writes = Vec::new();
        for (method, path, operation) in operations(&doc) {
            let method = method.to_lowercase();
            if crate::contract::writes_to_a_workspace(&path, &method) {
                writes.push(format!("{method} {path}"));
                assert_eq!(
                    operation["responses"]["507"]["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path}"
                );
            }
        }
        for expected in [
            "put /v1/sandboxes/{id}/files",
            "post /v1/users/{uid}/workdirs",
            "post /v1/sandboxes",
        ] {
            assert!(
                writes.iter().any(|w| w == expected),
                "{expected} not among {writes:?}"
            );
        }
    }

    #[test]
    fn every_path_parameter_is_in_the_path_and_every_other_parameter_is_not() {
        let doc = openapi_document();
        for (method, path, operation) in operations(&doc) {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let name = parameter["name"].as_str().unwrap();
                let in_template = path.contains(&format!("{{{name}}}"));
                let location = parameter["in"].as_str().unwrap();
                assert_eq!(
                    location == "path",
                    in_template,
                    "{method} {path}: {name} is declared in {location}"
                );
                if location == "path" {
                    assert!(
                        parameter["schema"]["pattern"].is_string()
                            || parameter["schema"]["type"] == "integer"
                            || name.ends_with("_id"),
                        "{method} {path}: {name} has no pattern"
                    );
                }
            }
        }
    }

    #[test]
    fn every_error_answer_is_documented_as_an_error_body() {
        let doc = openapi_document();
        for (method, path, operation) in operations(&doc) {
            for (status, response) in operation["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(
                        response["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ErrorBody",
                        "{method} {path} {status}"
                    );
                }
            }
            if operation.get("requestBody").is_some() {
                for status in ["400", "413"] {
                    assert!(
                        operation["responses"][status].is_object(),
                        "{method} {path} takes a body but does not document {status}"
                    );
                }
            }
        }
    }

    #[test]
    fn bodies_are_objects_or_bytes_and_an_optional_one_is_never_null() {
        let doc = openapi_document();
        for (method, path, operation) in operations(&doc) {
            let Some(body) = operation.get("requestBody") else {
                continue;
            };
            for (media_type, entry) in body["content"].as_object().unwrap() {
                let schema = &entry["schema"];
                let text = schema.to_string();
                assert!(!text.contains("\"null\""), "{method} {path}: {text}");
                match media_type.as_str() {
                    "application/octet-stream" => assert_eq!(
                        schema,
                        &serde_json::json!({"type": "string", "format": "binary"}),
                        "{method} {path}"
                    ),
                    "application/json" => {
                        assert!(schema["$ref"].is_string(), "{method} {path}: {text}")
                    }
                    other => panic!("{method} {path}: unexpected body type {other}"),
                }
            }
        }
    }

    #[test]
    fn every_contract_rule_names_a_property_that_exists() {
        let doc = openapi_document();
        for (schema, property, _) in crate::contract::property_rules() {
            assert!(
                doc["components"]["schemas"][schema]["properties"][property].is_object(),
                "the rule for {schema}.{property} names nothing"
            );
        }
    }

    #[test]
    fn every_fenced_operation_exists_and_documents_the_fence_header_and_its_refusals() {
        let doc = openapi_document();
        for (method, path) in crate::contract::FENCED_OPERATIONS {
            let operation = &doc["paths"][path][method];
            assert!(operation.is_object(), "{method} {path} is not an operation");
            let header = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == "X-Warren-Fence")
                .unwrap_or_else(|| panic!("{method} {path}: no X-Warren-Fence"));
            assert_eq!(header["in"], "header", "{method} {path}");
            assert_eq!(header["required"], false, "{method} {path}");
            assert!(header["schema"]["pattern"].is_string(), "{method} {path}");
            for (status, code) in [("409", "fence_stale"), ("400", "fence_invalid")] {
                let description = operation["responses"][status]["description"]
                    .as_str()
                    .unwrap_or("");
                assert!(description.contains(code), "{method} {path} {status}");
            }
        }
        // Reads are never fenced.
        let read = &doc["paths"]["/v1/sandboxes/{id}/files"]["get"];
        assert!(!read["parameters"].to_string().contains("X-Warren-Fence"));
    }

    #[test]
    fn every_change_to_a_sandbox_is_fenced_unless_it_is_the_guard_or_a_lease() {
        // The guard's own routes take the token in their body or query, and a lease holds
        // the runtime without changing it (I25).
        let unfenced = [
            ("POST", "/v1/sandboxes/{id}/guard"),
            ("DELETE", "/v1/sandboxes/{id}/guard"),
            ("POST", "/v1/sandboxes/{id}/guard/renew"),
            ("POST", "/v1/sandboxes/{id}/leases"),
            ("DELETE", "/v1/sandboxes/{id}/leases/{lease_id}"),
            ("POST", "/v1/sandboxes/{id}/leases/{lease_id}/renew"),
        ];
        let doc = openapi_document();
        for (method, path, _) in operations(&doc) {
            // Globs and greps are reads sent as POST.
            let read = path.ends_with("/files/glob") || path.ends_with("/files/grep");
            if !path.starts_with("/v1/sandboxes/{id}") || method == "GET" || read {
                continue;
            }
            let fenced = crate::contract::FENCED_OPERATIONS
                .contains(&(method.to_lowercase().as_str(), path.as_str()));
            assert!(
                fenced || unfenced.contains(&(method.as_str(), path.as_str())),
                "{method} {path} changes a sandbox but is not fenced"
            );
        }
    }

    /// `gvisor` is schema-valid only where the server would accept it (issue 19): nowhere
    /// when no backend runs gVisor, and with a backend that runs it when some do not.
    #[test]
    fn the_gvisor_tier_is_offered_only_on_backends_that_run_it() {
        let described = |backends: &[&str], gvisor: &[&str]| {
            let mut doc = openapi_document();
            let names = |list: &[&str]| list.iter().map(|b| (*b).to_owned()).collect();
            crate::contract::describe_server(
                &mut doc,
                &crate::contract::ServerFacts {
                    backends: names(backends),
                    host_dirs: Vec::new(),
                    secret_sources: Vec::new(),
                    docker: backends.contains(&"docker"),
                    gvisor: names(gvisor),
                },
            );
            doc["components"]["schemas"]["CreateSandbox"].clone()
        };
        let generated = &openapi_document()["components"]["schemas"];
        assert_eq!(
            generated["SandboxIsolation"]["enum"],
            serde_json::json!(["kernel", "gvisor"])
        );
        assert!(generated["SandboxInfo"]["required"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("isolation")));

        let none = described(&["local"], &[]);
        assert_eq!(
            none["properties"]["isolation"]["enum"],
            serde_json::json!(["kernel", null])
        );
        assert!(none.get("allOf").is_none());

        let all = described(&["local", "docker"], &["local", "docker"]);
        assert!(all["properties"]["isolation"].get("enum").is_none());
        assert!(all.get("allOf").is_none());

        let docker_only = described(&["local", "docker"], &["docker"]);
        assert_eq!(
            docker_only["allOf"][0]["then"],
            serde_json::json!({"properties": {"backend": {"enum": ["docker"]}},
                               "required": ["backend"]})
        );
        let default_only = described(&["local", "docker"], &["local"]);
        assert_eq!(
            default_only["allOf"][0]["then"],
            serde_json::json!({"properties": {"backend": {"enum": ["local", null]}}})
        );
    }

    #[test]
    fn bounded_integers_say_their_bounds() {
        let doc = openapi_document();
        let schemas = &doc["components"]["schemas"];
        for (schema, property, minimum, maximum) in [
            ("CreateLease", "ttl_s", 1, Some(3600)),
            ("CreateGuard", "ttl_s", 1, Some(3600)),
            ("RenewGuard", "ttl_s", 1, Some(3600)),
            ("RenewLease", "ttl_s", 1, Some(3600)),
            ("TerminateSandbox", "grace_s", 0, Some(300)),
            ("ExecCommand", "timeout_s", 1, None),
        ] {
            let field = &schemas[schema]["properties"][property];
            assert_eq!(field["minimum"], minimum, "{schema}.{property}");
            assert_eq!(
                field.get("maximum").and_then(Value::as_i64),
                maximum,
                "{schema}.{property}"
            );
        }
    }
}
