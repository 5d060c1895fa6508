-- A 2-layer graph attention network over the TU tables graph / node / edge, then a graph
-- readout. Same function as torch_geometric's GATConv (add_self_loops=False, no dropout):
--   h_i' = sum_{j -> i} alpha_ij W h_j + b,   alpha_ij = softmax_j(leaky_relu(a_dst.W h_i + a_src.W h_j, 0.2))
-- per attention head; layer 1 has 4 heads of 8, concatenated, layer 2 one head of 16.
-- W h is computed once per node (its own relation) and read per edge three ways: as the value,
-- and through the source and destination logits (one column per head). A node without in-edges
-- gets only the bias, as in PyG. The logits are linears from all heads' columns; PyG's per-head
-- vectors a_src, a_dst are the block-diagonal case (copy them there to reproduce PyG exactly).

CREATE TABLE node_x AS
SELECT n.node_id, n.x AS h
FROM node n;

-- layer 1: one-hot node labels x (7) -> 4 heads x 8
CREATE TABLE gat1_wx AS
SELECT n.node_id, linear(n.h, 32, 'gat1_w') AS h
FROM node_x n;

CREATE TABLE gat1_src AS
SELECT w.node_id, linear(w.h, 4, 'gat1_att_src') AS h
FROM gat1_wx w;

CREATE TABLE gat1_dst AS
SELECT w.node_id, linear(w.h, 4, 'gat1_att_dst') AS h
FROM gat1_wx w;

CREATE TABLE gat1_pre AS
SELECT e.dst AS node_id, attention(leaky_relu(s.h + d.h, 0.2), w.h) AS h
FROM edge e
JOIN gat1_src s ON s.node_id = e.src
JOIN gat1_dst d ON d.node_id = e.dst
JOIN gat1_wx w ON w.node_id = e.src
GROUP BY e.dst;

CREATE TABLE gat1_pre AS
SELECT n.node_id, bias(32, 'gat1_b') AS h
FROM node n;

CREATE TABLE gat1 AS
SELECT p.node_id, relu(p.h) AS h
FROM gat1_pre p;

-- layer 2: 32 -> one head of 16, no activation (the readout follows)
CREATE TABLE gat2_wx AS
SELECT l.node_id, linear(l.h, 16, 'gat2_w') AS h
FROM gat1 l;

CREATE TABLE gat2_src AS
SELECT w.node_id, linear(w.h, 1, 'gat2_att_src') AS h
FROM gat2_wx w;

CREATE TABLE gat2_dst AS
SELECT w.node_id, linear(w.h, 1, 'gat2_att_dst') AS h
FROM gat2_wx w;

CREATE TABLE gat2 AS
SELECT e.dst AS node_id, attention(leaky_relu(s.h + d.h, 0.2), w.h) AS h
FROM edge e
JOIN gat2_src s ON s.node_id = e.src
JOIN gat2_dst d ON d.node_id = e.dst
JOIN gat2_wx w ON w.node_id = e.src
GROUP BY e.dst;

CREATE TABLE gat2 AS
SELECT n.node_id, bias(16, 'gat2_b') AS h
FROM node n;

-- readout: mean of the node embeddings of each graph (PyG global_mean_pool)
CREATE TABLE gat_pool AS
SELECT n.graph_id, avg(l.h) AS h
FROM node n
JOIN gat2 l ON l.node_id = n.node_id
GROUP BY n.graph_id;

-- graph logits for the 2 classes (nn.Linear(16, 2))
CREATE TABLE gat_out AS
SELECT p.graph_id, linear(p.h, 2, 'gat_out_w') + bias(2, 'gat_out_b') AS h
FROM gat_pool p;
