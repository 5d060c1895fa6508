-- A 2-layer relational GCN over the TU tables graph / node / edge, one weight matrix per edge
-- label (MUTAG: the bond type), then a graph readout. Same function as torch_geometric's
-- RGCNConv (aggr='mean', root weight, bias):
--   h_i' = W_root h_i + b + sum_r mean_{j -r-> i} W_r h_j
-- `linear(x, d, 'name', e.label)` is a typed linear: one matrix per value of e.label, the rows
-- grouped by type and multiplied once per type. The mean per (node, edge type) is a sum with
-- 1 / |N_r(i)| counted in SQL, so types with more edges do not outweigh the others.

CREATE TABLE node_x AS
SELECT n.node_id, n.x AS h
FROM node n;

-- edges with the inverse of their destination's in-degree among edges of their label
CREATE TABLE rgcn1_pre AS
SELECT e.dst AS node_id, sum(linear(n.h, 16, 'rgcn1_w', e.label) * e.inverse_degree) AS h
FROM (SELECT src, dst, label, 1.0 / count(*) OVER (PARTITION BY dst, label) AS inverse_degree FROM edge) e
JOIN node_x n ON n.node_id = e.src
GROUP BY e.dst;

CREATE TABLE rgcn1_pre AS
SELECT n.node_id, linear(n.x, 16, 'rgcn1_root') + bias(16, 'rgcn1_b') AS h
FROM node n;

CREATE TABLE rgcn1 AS
SELECT p.node_id, relu(p.h) AS h
FROM rgcn1_pre p;

-- layer 2: 16 -> 16, no activation (the readout follows)
CREATE TABLE rgcn2 AS
SELECT e.dst AS node_id, sum(linear(l.h, 16, 'rgcn2_w', e.label) * e.inverse_degree) AS h
FROM (SELECT src, dst, label, 1.0 / count(*) OVER (PARTITION BY dst, label) AS inverse_degree FROM edge) e
JOIN rgcn1 l ON l.node_id = e.src
GROUP BY e.dst;

CREATE TABLE rgcn2 AS
SELECT l.node_id, linear(l.h, 16, 'rgcn2_root') + bias(16, 'rgcn2_b') AS h
FROM rgcn1 l;

-- readout: mean of the node embeddings of each graph (PyG global_mean_pool)
CREATE TABLE rgcn_pool AS
SELECT n.graph_id, avg(l.h) AS h
FROM node n
JOIN rgcn2 l ON l.node_id = n.node_id
GROUP BY n.graph_id;

-- graph logits for the 2 classes (nn.Linear(16, 2))
CREATE TABLE rgcn_out AS
SELECT p.graph_id, linear(p.h, 2, 'rgcn_out_w') + bias(2, 'rgcn_out_b') AS h
FROM rgcn_pool p;
