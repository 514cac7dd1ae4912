-- A Python UDF called on whole columns: how many 'l's each product name has.
CREATE FUNCTION count_char AS 'udfs.count_char' LANGUAGE PYTHON;

CREATE TABLE orders (
  id BIGINT,
  customer_id BIGINT,
  product STRING,
  amount DECIMAL(10, 2),
  status STRING,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'orders', 'format' = 'debezium-json');

CREATE TABLE product_letters (
  id BIGINT,
  product STRING,
  ls BIGINT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'product_letters', 'format' = 'upsert-json');

INSERT INTO product_letters
SELECT id, product, count_char(product, 'l') FROM orders;
