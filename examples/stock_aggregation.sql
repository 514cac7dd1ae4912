-- Stock per product with Paimon's aggregation merge engine at the sink: every stock
-- movement adds to the product's quantity, and the last warehouse seen is kept. The merge
-- engine is the sink's conflict policy, so there is no ON CONFLICT clause.
CREATE TABLE stock_movements (product_id BIGINT, warehouse STRING, quantity BIGINT)
  WITH ('topic' = 'stock_movements', 'format' = 'json');

CREATE TABLE stock (
  product_id BIGINT,
  warehouse STRING,
  quantity BIGINT,
  PRIMARY KEY (product_id) NOT ENFORCED
) WITH (
  'topic' = 'stock',
  'format' = 'upsert-json',
  'merge-engine' = 'aggregation',
  'fields.warehouse.aggregate-function' = 'last_non_null_value',
  'fields.quantity.aggregate-function' = 'sum'
);

INSERT INTO stock SELECT product_id, warehouse, quantity FROM stock_movements;
