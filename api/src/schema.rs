//! Schema post-processing for our CRDs.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;

/// Remove `nullable: true` from a schema and all its subschemas.
///
/// schemars marks every `Option` field nullable, but the apiserver keeps explicit `null`s
/// of nullable fields, where `has(self.containerDiscriminator)` would then be true. For
/// non-nullable fields it prunes `null`s before defaulting and validation, so the CEL rules
/// see `null` exactly as an absent field.
pub(crate) fn strip_nullable(schema: &mut JSONSchemaProps) {
    schema.nullable = None;
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        strip_nullable(child);
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(items)) = schema.items.as_mut() {
        strip_nullable(items);
    }
}
