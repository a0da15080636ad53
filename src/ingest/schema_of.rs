//! The columns a run parses records into: bronze's, the declared ones, or those of the first
//! landing files.

use tracing::info;

use super::landing::{Landing, LandingFile};
use super::schema::{self, Col};
use super::{csv, debezium, json, parquet, IngestError, Run, INFER_RECORDS};
use crate::config::pipeline::ingest::{ColumnType, Format};
use crate::config::pipeline::SchemaChange;
use crate::run::RunError;

impl Run<'_, '_> {
    /// The columns records are parsed into: bronze's (plus declared ones it lacks, when
    /// allowed), else the declared schema, else inferred from the first files.
    pub(super) async fn columns(
        &mut self,
        bronze: Option<&arrow::datatypes::Schema>,
        source: Option<(&Landing, &[LandingFile])>,
    ) -> Result<Vec<Col>, RunError> {
        let spec = self.spec;
        let schema_err = |message: String| IngestError::Schema {
            pipeline: self.p.path.display().to_string(),
            message,
        };
        if let Some(bronze) = bronze {
            let mut cols = Vec::new();
            for f in bronze.fields() {
                if schema::is_bookkeeping(f.name()) {
                    continue;
                }
                let Some(ty) = schema::from_arrow(f.data_type()) else {
                    return Err(schema_err(format!("bronze column `{}` has type {}, which ingest cannot parse records into (it parses string, long, int, double, boolean, timestamp, date and decimal(p, s) with p up to 38)", f.name(), f.data_type())).into());
                };
                let declared = spec.schema.iter().find(|d| d.name == *f.name());
                if let Some(d) = declared {
                    if d.ty != ty {
                        return Err(schema_err(format!("`schema:` declares `{}` as {}, but bronze has it as {}; declare the type bronze has (a column's type cannot change in place)", d.name, schema::type_name(d.ty), schema::type_name(ty))).into());
                    }
                }
                cols.push(Col {
                    name: f.name().clone(),
                    ty,
                    required: declared.is_some_and(|d| d.required),
                });
            }
            let missing: Vec<&crate::config::pipeline::ingest::DeclaredColumn> = spec
                .schema
                .iter()
                .filter(|d| bronze.field_with_name(&d.name).is_err())
                .collect();
            if !missing.is_empty() {
                let names: Vec<String> = missing.iter().map(|d| format!("`{}`", d.name)).collect();
                if spec.on_schema_change != SchemaChange::AddNewColumns {
                    return Err(schema_err(format!("`schema:` declares {} that bronze does not have; add them with `on_schema_change: add_new_columns`, or remove them from `schema:`", names.join(", "))).into());
                }
                for d in missing {
                    cols.push(Col::from(d));
                    self.c.columns_added.push(d.name.clone());
                }
            }
            return Ok(cols);
        }
        if !spec.schema.is_empty() {
            let cols = spec.schema.iter().map(Col::from).collect();
            return Ok(match spec.format {
                Format::Debezium => debezium::with_meta(cols),
                _ => cols,
            });
        }
        let Some((landing, files)) = source else {
            return Err(schema_err(
                "the columns cannot be inferred from this source; declare them with `schema:`"
                    .to_string(),
            )
            .into());
        };
        let mut found: Vec<(String, Option<ColumnType>)> = Vec::new();
        let shape = self.shape(&[]);
        for f in files.iter().take(5) {
            let body = landing.read(f).await?;
            match spec.format {
                Format::Json => json::infer(&body, INFER_RECORDS, &mut found),
                Format::Csv => csv::infer(&body, &shape, INFER_RECORDS, &mut found),
                Format::Parquet => parquet::infer(body, &mut found),
                Format::Debezium => debezium::infer(&body, INFER_RECORDS, &mut found),
            }
        }
        let cols: Vec<Col> = found
            .into_iter()
            .filter(|(n, _)| !n.is_empty() && !schema::is_bookkeeping(n))
            .map(|(name, ty)| Col {
                name,
                ty: ty.unwrap_or(ColumnType::String),
                required: false,
            })
            .collect();
        if cols.is_empty() {
            return Err(schema_err("no columns could be inferred from the first landing files (empty, or no record parses); declare them with `schema:`".to_string()).into());
        }
        info!(
            columns = cols.len(),
            "schema inferred from the first landing files"
        );
        Ok(match spec.format {
            Format::Debezium => debezium::with_meta(cols),
            _ => cols,
        })
    }
}
