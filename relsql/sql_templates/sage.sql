-- A 2-layer GraphSAGE with mean aggregation over the TU tables graph / node / edge, then a
-- graph readout. Same function as torch_geometric's SAGEConv with its defaults:
--   h_i' = W_l mean_{j -> i} h_j + b_l + W_r h_i
-- (lin_l has the bias, lin_r none; messages flow src -> dst as in the edge table; a node
-- without in-edges gets W_r h_i + b_l, as PyG's mean over nothing is 0).
-- Each layer is two statements for one relation, which relsql sums: the neighbour mean
-- (grouped, only nodes with in-edges) and the root term (one row per node).

-- node features as a relation: joined by key below, so the plan gathers (or sparsely multiplies)
-- one row per node instead of reading a copy of x for every edge from the database
CREATE TABLE node_x AS
SELECT n.node_id, n.x AS h
FROM node n;

-- layer 1, before ReLU: one-hot node labels x (7) -> 16
CREATE TABLE sage1_pre AS
SELECT e.dst AS node_id, avg(linear(n.h, 16, 'sage1_wl')) AS h
FROM edge e
JOIN node_x n ON n.node_id = e.src
GROUP BY e.dst;

CREATE TABLE sage1_pre AS
SELECT n.node_id, linear(n.x, 16, 'sage1_wr') + bias(16, 'sage1_bl') AS h
FROM node n;

-- layer 1 output: ReLU
CREATE TABLE sage1 AS
SELECT p.node_id, relu(p.h) AS h
FROM sage1_pre p;

-- layer 2: 16 -> 16, no activation (the readout follows)
CREATE TABLE sage2 AS
SELECT e.dst AS node_id, avg(linear(l.h, 16, 'sage2_wl')) AS h
FROM edge e
JOIN sage1 l ON l.node_id = e.src
GROUP BY e.dst;

CREATE TABLE sage2 AS
SELECT l.node_id, linear(l.h, 16, 'sage2_wr') + bias(16, 'sage2_bl') AS h
FROM sage1 l;

-- readout: mean of the node embeddings of each graph (PyG global_mean_pool)
CREATE TABLE sage_pool AS
SELECT n.graph_id, avg(l.h) AS h
FROM node n
JOIN sage2 l ON l.node_id = n.node_id
GROUP BY n.graph_id;

-- graph logits for the 2 classes (nn.Linear(16, 2))
CREATE TABLE sage_out AS
SELECT p.graph_id, linear(p.h, 2, 'sage_out_w') + bias(2, 'sage_out_b') AS h
FROM sage_pool p;
