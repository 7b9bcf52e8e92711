//! What the database will do with a statement: its plan (`EXPLAIN`), reduced to the tables it
//! reads and how — which index, which of the index's leading columns the plan fixes, and
//! whether the read is repeated for every row of another read.
//!
//! A statement whose cost must not hang on the planner's statistics reads each table either
//! by key (a probe: the index's leading columns fixed by a key column, bizId say) or, once, by
//! a time window; a read repeated per row that is anything but a probe is the quadratic plan
//! (a nested loop that walks a whole range of an index for every outer row), and a full scan
//! costs the table, not the window. [`Read::is_bounded`] says which a read is; the reconciler
//! and the overview name their key and window columns ([`Bounds`]), their tests assert on it
//! and `idemgate-bench reconcile` prints it.
//!
//! PostgreSQL's plan is read in its YAML form (the `Any` driver cannot decode the JSON type),
//! MySQL/MariaDB's as `EXPLAIN FORMAT=JSON`, SQLite's as `EXPLAIN QUERY PLAN` (its rules pick
//! the same plan whatever the statistics, unless `ANALYZE` has been run). This module knows
//! plans, not tables.

use std::collections::HashMap;

use serde::Serialize;
use sqlx::Row;

use idemgate::inspect::Bounds;
use idemgate::store::{Backend, Bound, Sql, Store, query_built};

/// One read of a table in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Read {
    pub table: String,
    /// The index read; `None` for a scan of the table itself.
    pub index: Option<String>,
    /// The index's leading columns the plan fixes, in index order: the part of the index the
    /// read is confined to. Empty for a scan of the whole table or index.
    pub fixed: Vec<String>,
    /// Run again for every row of another read: the inner side of a nested loop, a correlated
    /// subquery.
    pub per_row: bool,
    /// The plan's own words for the read, for people.
    pub detail: String,
    /// A read of a partition that holds no row (a day of the partitioned delivery log not yet
    /// come): the planner picks whatever costs least on nothing, and it costs nothing.
    pub empty_partition: bool,
}

impl Read {
    /// A probe by key, or a window read once. Anything else costs what the planner's
    /// statistics make of it.
    pub fn is_bounded(&self, bounds: &Bounds) -> bool {
        let fixes = |columns: &[&str]| self.fixed.iter().any(|c| columns.contains(&c.as_str()));
        fixes(bounds.keys) || (!self.per_row && fixes(bounds.windows))
    }
}

impl std::fmt::Display for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.index {
            None => write!(f, "{}: whole table", self.table)?,
            Some(index) if self.fixed.is_empty() => write!(f, "{}: whole index {index}", self.table)?,
            Some(index) => write!(f, "{} by {index} ({})", self.table, self.fixed.join(", "))?,
        }
        if self.per_row {
            f.write_str(", once per row")?;
        }
        write!(f, " [{}]", self.detail)
    }
}

/// Why a plan could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("explain: {0}")]
    Database(#[from] sqlx::Error),
    #[error("explain: the plan could not be read: {0}")]
    Unreadable(String),
}

/// The reads of `statement`'s plan, as the database would run it now with its values.
pub async fn reads(store: &Store, statement: &Bound) -> Result<Vec<Read>, PlanError> {
    let (prefix, backend) = match store.backend() {
        Backend::Postgres => ("EXPLAIN (FORMAT YAML, COSTS OFF) ", Backend::Postgres),
        Backend::MySql => ("EXPLAIN FORMAT=JSON ", Backend::MySql),
        Backend::Sqlite => ("EXPLAIN QUERY PLAN ", Backend::Sqlite),
    };
    let q = statement.bind(query_built(backend, format!("{prefix}{}", statement.sql.written_for(backend))));
    if backend == Backend::Sqlite {
        let lines = q
            .fetch_all(store.pool())
            .await?
            .iter()
            .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?, r.try_get::<String, _>(3)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        return sqlite_reads(&lines);
    }
    let text = q
        .fetch_all(store.pool())
        .await?
        .iter()
        .map(|r| r.try_get::<String, _>(0))
        .collect::<Result<Vec<_>, _>>()?
        .join("\n");
    match backend {
        Backend::Postgres => {
            let mut reads = postgres_reads(&text)?;
            let mut columns = IndexColumns::default();
            for read in &mut reads {
                read.fixed = columns.fixed(store, read).await?;
                partition_root(store, read).await?;
            }
            Ok(reads)
        }
        _ => mysql_reads(&text),
    }
}

/// A read of a partition (a day of the partitioned delivery log) named as a read of its table,
/// by the table's own index: the partition is kept in `detail`. PostgreSQL plans each partition
/// as a table of its own, with indexes named after it.
async fn partition_root(store: &Store, read: &mut Read) -> Result<(), PlanError> {
    let root = |name: String| async move {
        let row = query_built(
            Backend::Postgres,
            "SELECT CAST(pg_partition_root(to_regclass(?)) AS TEXT)".to_owned(),
        )
        .bind(name)
        .fetch_one(store.pool())
        .await?;
        row.try_get::<Option<String>, _>(0)
    };
    let Some(table) = root(read.table.clone()).await?.filter(|t| *t != read.table) else { return Ok(()) };
    if let Some(index) = read.index.clone() {
        read.index = Some(root(index.clone()).await?.unwrap_or(index));
    }
    // The partition's name is the plan's own (a table this process just read from the catalog).
    let holds: i64 = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM \"{}\" LIMIT 1) t",
        read.table.replace('"', "\"\"")
    )))
    .fetch_one(store.pool())
    .await?
    .try_get(0)?;
    read.empty_partition = holds == 0;
    read.detail = format!("{}: {}", read.table, read.detail);
    read.table = table;
    Ok(())
}

/// A PostgreSQL read before its fixed columns are known: the index condition is kept in
/// `detail` and matched against the index's columns.
fn postgres_reads(yaml: &str) -> Result<Vec<Read>, PlanError> {
    let nodes = yaml_nodes(yaml);
    if nodes.is_empty() {
        return Err(PlanError::Unreadable(yaml.chars().take(200).collect()));
    }
    let mut reads = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let kind = node.get("Node Type");
        // A bitmap index scan reads for the heap scan above it (through BitmapAnd/Or).
        let mut owner = Some(i);
        while let Some(o) =
            owner.filter(|o| kind == "Bitmap Index Scan" && nodes[*o].get("Relation Name").is_empty())
        {
            owner = nodes[o].parent;
        }
        let relation = owner.map_or("", |o| nodes[o].get("Relation Name"));
        if relation.is_empty() || kind == "Bitmap Heap Scan" {
            continue;
        }
        let index = node.fields.get("Index Name").cloned();
        let condition = node.get("Index Cond");
        reads.push(Read {
            table: relation.to_owned(),
            index,
            fixed: Vec::new(),
            per_row: repeated(&nodes, i),
            detail: if condition.is_empty() { kind.to_owned() } else { format!("{kind}: {condition}") },
            empty_partition: false,
        });
    }
    Ok(reads)
}

/// Whether node `i` runs once per row of another: it, or a node above it, is a correlated
/// subplan or the inner side of a nested loop.
fn repeated(nodes: &[Node], mut i: usize) -> bool {
    while let Some(parent) = nodes[i].parent {
        let relationship = nodes[i].get("Parent Relationship");
        if relationship == "SubPlan"
            || (relationship == "Inner" && nodes[parent].get("Node Type") == "Nested Loop")
        {
            return true;
        }
        i = parent;
    }
    false
}

/// One node of a YAML plan: its scalar fields and its parent.
#[derive(Debug, Default)]
struct Node {
    fields: HashMap<String, String>,
    parent: Option<usize>,
}

impl Node {
    fn get(&self, key: &str) -> &str {
        self.fields.get(key).map_or("", String::as_str)
    }
}

/// The plan nodes of PostgreSQL's `EXPLAIN (FORMAT YAML)`. Each node opens with
/// `- Node Type: "…"`; its fields sit at the indentation of that key, its children (under
/// `Plans:`) deeper. Lists of scalars (sort keys) are skipped.
fn yaml_nodes(yaml: &str) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    // (indentation of the node's keys, node index), outermost first.
    let mut open: Vec<(usize, usize)> = Vec::new();
    for line in yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        let body = line.trim_start();
        let (key_indent, field) = match body.strip_prefix("- ") {
            Some(rest) if rest.starts_with("Node Type:") => (indent + 2, rest),
            Some(_) => continue,
            None => (indent, body),
        };
        let Some((key, value)) = field.split_once(':') else { continue };
        if field.starts_with("Node Type:") {
            while open.last().is_some_and(|(i, _)| *i >= key_indent) {
                open.pop();
            }
            nodes.push(Node { fields: HashMap::new(), parent: open.last().map(|(_, n)| *n) });
            open.push((key_indent, nodes.len() - 1));
        }
        if let Some(&(_, n)) = open.iter().rev().find(|(i, _)| *i == key_indent) {
            nodes[n].fields.insert(key.to_owned(), unquote(value.trim()));
        }
    }
    nodes
}

fn unquote(value: &str) -> String {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .map_or_else(|| value.to_owned(), |v| v.replace("\\\"", "\"").replace("\\\\", "\\"))
}

static INDEX_COLUMNS: Sql = Sql::new(
    "SELECT CAST(a.attname AS TEXT) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
     WHERE c.relname = ? AND pg_table_is_visible(c.oid) \
     ORDER BY array_position(CAST(i.indkey AS SMALLINT[]), a.attnum)",
);

/// The columns of PostgreSQL indexes, read from the catalog once per index.
#[derive(Default)]
struct IndexColumns(HashMap<String, Vec<String>>);

impl IndexColumns {
    /// The leading columns of `read`'s index that its condition names: the prefix it fixes.
    async fn fixed(&mut self, store: &Store, read: &Read) -> Result<Vec<String>, sqlx::Error> {
        let Some(index) = &read.index else { return Ok(Vec::new()) };
        if !self.0.contains_key(index) {
            let columns = store
                .query(&INDEX_COLUMNS)
                .bind(index.clone())
                .fetch_all(store.pool())
                .await?
                .iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<Result<Vec<_>, _>>()?;
            self.0.insert(index.clone(), columns);
        }
        let named = identifiers(&read.detail);
        Ok(self.0[index].iter().take_while(|c| named.contains(c.as_str())).cloned().collect())
    }
}

/// The column names a condition mentions, without their table aliases.
fn identifiers(condition: &str) -> std::collections::HashSet<&str> {
    condition
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter(|w| !w.is_empty())
        .map(|w| w.rsplit('.').next().unwrap_or(w))
        .collect()
}

/// The reads of SQLite's `EXPLAIN QUERY PLAN`, given as its rows (id, parent, detail):
/// `SEARCH t USING [COVERING] INDEX i (a=? AND b>?)` reads `t` by `i` with the columns named in
/// the parentheses fixed; `SCAN t` reads all of it. A read under a correlated subquery, or after
/// another table's read under the same parent (the inner side of a join), runs once per row.
/// The scans of a subquery's own result (`MATERIALIZE s`, `CO-ROUTINE s`) are not reads of a
/// table.
fn sqlite_reads(lines: &[(i64, i64, String)]) -> Result<Vec<Read>, PlanError> {
    let derived: Vec<&str> = lines
        .iter()
        .filter_map(|(_, _, d)| d.strip_prefix("MATERIALIZE ").or_else(|| d.strip_prefix("CO-ROUTINE ")))
        .map(str::trim)
        .collect();
    let parent_of = |id: i64| lines.iter().find(|(i, _, _)| *i == id).map(|(_, p, _)| *p);
    let correlated = |mut id: i64| {
        while let Some(parent) = parent_of(id) {
            if lines.iter().any(|(i, _, d)| *i == parent && d.starts_with("CORRELATED ")) {
                return true;
            }
            id = parent;
        }
        false
    };
    let mut reads: Vec<Read> = Vec::new();
    let mut read_under: Vec<i64> = Vec::new();
    for (id, parent, detail) in lines {
        let Some(rest) = detail.strip_prefix("SEARCH ").or_else(|| detail.strip_prefix("SCAN ")) else {
            continue;
        };
        let table = rest.split(' ').next().unwrap_or("");
        if table.is_empty() || table.starts_with('(') || table == "CONSTANT" || derived.contains(&table) {
            continue;
        }
        let index = ["USING COVERING INDEX ", "USING INDEX "]
            .iter()
            .find_map(|u| {
                rest.split_once(u).map(|(_, after)| after.split(' ').next().unwrap_or("").to_owned())
            })
            .or_else(|| rest.contains("USING INTEGER PRIMARY KEY").then(|| "PRIMARY KEY".to_owned()));
        let fixed = match (rest.find('('), rest.rfind(')')) {
            (Some(open), Some(close)) if open < close => rest[open + 1..close]
                .split(" AND ")
                .filter_map(|c| c.split(|ch: char| "=<>".contains(ch)).next())
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty())
                .collect(),
            _ => Vec::new(),
        };
        reads.push(Read {
            table: table.to_owned(),
            index,
            fixed,
            per_row: correlated(*id) || read_under.contains(parent),
            detail: detail.clone(),
            empty_partition: false,
        });
        read_under.push(*parent);
    }
    if reads.is_empty() && !lines.iter().any(|(_, _, d)| d.contains("CONSTANT ROW")) {
        return Err(PlanError::Unreadable(
            lines
                .iter()
                .map(|(_, _, d)| d.as_str())
                .collect::<Vec<_>>()
                .join("; ")
                .chars()
                .take(200)
                .collect(),
        ));
    }
    Ok(reads)
}

/// The reads of MySQL/MariaDB's `EXPLAIN FORMAT=JSON`: every `table` object, with the key
/// parts it uses. A table inside a subquery that is not materialized runs once per outer row
/// (the reconciler's subqueries are all correlated), as does every table after the first of a
/// join.
fn mysql_reads(json: &str) -> Result<Vec<Read>, PlanError> {
    let plan: serde_json::Value =
        serde_json::from_str(json).map_err(|e| PlanError::Unreadable(format!("{e}: {json:.200}")))?;
    let mut reads = Vec::new();
    walk_mysql(&plan, false, &mut reads);
    if reads.is_empty() && !json.contains("optimized away") && !json.contains("no tables used") {
        return Err(PlanError::Unreadable(json.chars().take(200).collect()));
    }
    Ok(reads)
}

fn walk_mysql(value: &serde_json::Value, per_row: bool, reads: &mut Vec<Read>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match key.as_str() {
                    "table" => {
                        if let Some(read) = mysql_read(v, per_row) {
                            reads.push(read);
                        }
                        walk_mysql(v, per_row, reads);
                    }
                    // Subqueries listed under a query block run per row unless materialized.
                    "subqueries" => walk_mysql(v, true, reads),
                    "materialization" => walk_mysql(v, false, reads),
                    "nested_loop" => match v {
                        Value::Array(tables) => {
                            for (i, t) in tables.iter().enumerate() {
                                walk_mysql(t, per_row || i > 0, reads);
                            }
                        }
                        other => walk_mysql(other, per_row, reads),
                    },
                    _ => walk_mysql(v, per_row, reads),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| walk_mysql(v, per_row, reads)),
        _ => {}
    }
}

fn mysql_read(table: &serde_json::Value, per_row: bool) -> Option<Read> {
    let name = table.get("table_name")?.as_str()?;
    let access = table.get("access_type").and_then(|v| v.as_str()).unwrap_or("");
    let index = table.get("key").and_then(|v| v.as_str()).map(str::to_owned);
    let parts: Vec<String> = table
        .get("used_key_parts")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|p| p.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let whole = matches!(access, "ALL" | "index");
    // `ref` names the outer columns as schema.table.column; the column is what matters.
    let refs: Vec<&str> = table
        .get("ref")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|r| r.as_str()).map(|r| r.rsplit('.').next().unwrap_or(r)).collect())
        .unwrap_or_default();
    Some(Read {
        table: name.to_owned(),
        index: if access == "ALL" { None } else { index },
        fixed: if whole { Vec::new() } else { parts },
        per_row,
        detail: if refs.is_empty() { access.to_owned() } else { format!("{access} on {}", refs.join(", ")) },
        empty_partition: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds { keys: &["biz_id"], windows: &["logged_at_ms"] };

    #[test]
    fn a_yaml_plan_becomes_its_reads_with_the_repeated_ones_marked() {
        let yaml = r#"- Plan: 
    Node Type: "Nested Loop"
    Join Type: "Anti"
    Plans: 
      - Node Type: "Index Scan"
        Parent Relationship: "Outer"
        Index Name: "delivery_log_outcome"
        Relation Name: "delivery_log"
        Alias: "d"
        Index Cond: "(((outcome)::text = 'processed'::text) AND (logged_at_ms >= '1'::bigint))"
        Plans: 
          - Node Type: "Index Scan"
            Parent Relationship: "SubPlan"
            Subplan Name: "SubPlan 1"
            Index Name: "idempotent_record_claim_key"
            Relation Name: "idempotent_record"
            Index Cond: "((biz_id)::text = (d.biz_id)::text)"
      - Node Type: "Bitmap Heap Scan"
        Parent Relationship: "Inner"
        Relation Name: "idempotent_record"
        Alias: "idempotent_record"
        Recheck Cond: "((consumer_group)::text = 'g'::text)"
        Plans: 
          - Node Type: "Bitmap Index Scan"
            Parent Relationship: "Outer"
            Index Name: "idempotent_record_claim_key"
            Index Cond: "((consumer_group)::text = 'g'::text)"
"#;
        let reads = postgres_reads(yaml).unwrap();
        let summary: Vec<(&str, bool, &str)> =
            reads.iter().map(|r| (r.table.as_str(), r.per_row, r.index.as_deref().unwrap_or(""))).collect();
        assert_eq!(
            summary,
            [
                ("delivery_log", false, "delivery_log_outcome"),
                ("idempotent_record", true, "idempotent_record_claim_key"),
                ("idempotent_record", true, "idempotent_record_claim_key"),
            ]
        );
        assert!(reads[2].detail.contains("consumer_group"), "{}", reads[2].detail);
    }

    #[test]
    fn probes_and_windows_are_bounded_and_prefix_ranges_repeated_per_row_are_not() {
        let read = |fixed: &[&str], per_row| Read {
            table: "t".to_owned(),
            index: Some("i".to_owned()),
            fixed: fixed.iter().map(|c| (*c).to_owned()).collect(),
            per_row,
            detail: String::new(),
            empty_partition: false,
        };
        assert!(read(&["consumer_group", "biz_type", "biz_id"], true).is_bounded(&BOUNDS));
        assert!(read(&["outcome", "logged_at_ms"], false).is_bounded(&BOUNDS));
        assert!(!read(&["outcome", "logged_at_ms"], true).is_bounded(&BOUNDS));
        assert!(!read(&["consumer_group"], true).is_bounded(&BOUNDS));
        assert!(!read(&["consumer_group"], false).is_bounded(&BOUNDS));
        assert!(!read(&[], false).is_bounded(&BOUNDS));
    }

    #[test]
    fn a_sqlite_plan_names_each_index_and_the_columns_it_fixes() {
        let line = |id, parent, detail: &str| (id, parent, detail.to_owned());
        let lines = [
            line(1, 0, "COMPOUND QUERY"),
            line(2, 1, "LEFT-MOST SUBQUERY"),
            line(4, 2, "CO-ROUTINE t"),
            line(
                7,
                4,
                "SEARCH delivery_log USING COVERING INDEX delivery_log_key_outcome \
                 (biz_id=? AND biz_type=? AND consumer_group=? AND execute_time=? AND outcome=?)",
            ),
            line(12, 2, "SCAN t"),
            line(20, 1, "UNION ALL"),
            line(22, 20, "SCAN delivery_log"),
            line(
                25,
                20,
                "SEARCH idempotent_record USING INDEX idempotent_record_claim_key (consumer_group=?)",
            ),
            line(30, 20, "CORRELATED SCALAR SUBQUERY 3"),
            line(33, 30, "SEARCH shop_order USING INTEGER PRIMARY KEY (rowid=?)"),
        ];
        let reads = sqlite_reads(&lines).unwrap();
        let summary: Vec<(&str, Option<&str>, usize, bool)> =
            reads.iter().map(|r| (r.table.as_str(), r.index.as_deref(), r.fixed.len(), r.per_row)).collect();
        assert_eq!(
            summary,
            [
                ("delivery_log", Some("delivery_log_key_outcome"), 5, false),
                ("delivery_log", None, 0, false),
                ("idempotent_record", Some("idempotent_record_claim_key"), 1, true),
                ("shop_order", Some("PRIMARY KEY"), 1, true),
            ]
        );
        assert_eq!(reads[0].fixed, ["biz_id", "biz_type", "consumer_group", "execute_time", "outcome"]);
        assert!(!reads[1].is_bounded(&BOUNDS), "a scan of the whole log is not bounded");
    }

    #[test]
    fn a_mysql_plan_marks_dependent_subqueries_and_materializations() {
        let json = r#"{"query_block": {"select_id": 1, "nested_loop": [{"table": {"table_name": "d",
            "access_type": "range", "key": "delivery_log_outcome", "used_key_parts": ["outcome", "logged_at_ms"]}}],
            "subqueries": [{"materialization": {"query_block": {"select_id": 3, "nested_loop": [{"table":
            {"table_name": "r", "access_type": "index", "key": "idempotent_record_archive_key",
            "used_key_parts": ["biz_id", "biz_type"]}}]}}},
            {"query_block": {"select_id": 2, "nested_loop": [{"table": {"table_name": "idempotent_record",
            "access_type": "eq_ref", "key": "idempotent_record_claim_key",
            "used_key_parts": ["consumer_group", "biz_type", "biz_id", "execute_time"], "ref": ["func"]}}]}}]}}"#;
        let reads = mysql_reads(json).unwrap();
        let summary: Vec<(&str, bool, bool)> =
            reads.iter().map(|r| (r.table.as_str(), r.per_row, r.is_bounded(&BOUNDS))).collect();
        assert_eq!(summary, [("d", false, true), ("r", false, false), ("idempotent_record", true, true)]);
        assert_eq!(reads[1].to_string(), "r: whole index idempotent_record_archive_key [index]");
    }
}
