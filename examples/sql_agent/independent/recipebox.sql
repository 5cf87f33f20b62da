-- recipebox: a cook's recipe collection: recipes, ingredients, quantities and reviews (lowercase names run together, link table with grams, nutrition per 100 g)
CREATE TABLE recipe (recipeno INTEGER PRIMARY KEY, recipename TEXT NOT NULL, cuisine TEXT, serves INTEGER, preptimemin INTEGER, createdby TEXT);
CREATE TABLE ingredient (ingno INTEGER PRIMARY KEY, ingname TEXT NOT NULL, isvegan INTEGER, kcalper100g INTEGER);
CREATE TABLE recipeline (recipeno INTEGER REFERENCES recipe(recipeno), ingno INTEGER REFERENCES ingredient(ingno), grams INTEGER, PRIMARY KEY (recipeno, ingno));
CREATE TABLE review (reviewno INTEGER PRIMARY KEY, recipeno INTEGER REFERENCES recipe(recipeno), stars INTEGER, reviewedon TEXT, reviewer TEXT);
INSERT INTO recipe VALUES
  (1, 'Shakshuka', 'Middle Eastern', 2, 25, 'amira'),
  (2, 'Lentil Soup', 'Middle Eastern', 4, 40, 'amira'),
  (3, 'Margherita Pizza', 'Italian', 2, 90, 'luca'),
  (4, 'Pesto Pasta', 'Italian', 4, 15, 'luca'),
  (5, 'Bean Tacos', 'Mexican', 4, 20, 'sofia'),
  (6, 'Guacamole', 'Mexican', 6, 10, 'sofia'),
  (7, 'Chicken Enchiladas', 'Mexican', 5, 55, 'sofia'),
  (8, 'Mushroom Risotto', 'Italian', 3, 45, 'luca'),
  (9, 'Tomato Salad', 'Mediterranean', 2, 8, 'amira'),
  (10, 'Garlic Bread', 'Italian', 6, 18, 'ben');
INSERT INTO ingredient VALUES
  (1, 'egg', 0, 143), (2, 'tomato', 1, 18), (3, 'onion', 1, 40), (4, 'garlic', 1, 149),
  (5, 'red lentils', 1, 352), (6, 'olive oil', 1, 884), (7, 'mozzarella', 0, 280), (8, 'flour', 1, 364),
  (9, 'basil', 1, 23), (10, 'pasta', 1, 371), (11, 'parmesan', 0, 431), (12, 'black beans', 1, 132),
  (13, 'avocado', 1, 160), (14, 'chicken', 0, 165), (15, 'rice', 1, 360), (16, 'mushroom', 1, 22),
  (17, 'butter', 0, 717), (18, 'baguette', 1, 270);
INSERT INTO recipeline VALUES
  (1, 1, 200), (1, 2, 400), (1, 3, 100), (1, 4, 10), (1, 6, 20),
  (2, 5, 250), (2, 3, 150), (2, 4, 15), (2, 6, 30), (2, 2, 200),
  (3, 8, 300), (3, 2, 200), (3, 7, 250), (3, 9, 10), (3, 6, 25),
  (4, 10, 400), (4, 9, 60), (4, 11, 50), (4, 4, 12), (4, 6, 60),
  (5, 12, 400), (5, 3, 100), (5, 13, 150), (5, 2, 150),
  (6, 13, 450), (6, 3, 60), (6, 2, 100),
  (7, 14, 500), (7, 2, 300), (7, 7, 150), (7, 3, 120),
  (8, 15, 300), (8, 16, 350), (8, 11, 60), (8, 17, 40), (8, 3, 80),
  (9, 2, 500), (9, 6, 30), (9, 9, 8),
  (10, 18, 300), (10, 4, 25), (10, 17, 80);
INSERT INTO review VALUES
  (1, 1, 5, '2023-02-11', 'kim'), (2, 1, 4, '2023-06-30', 'raj'), (3, 2, 5, '2022-11-05', 'kim'),
  (4, 3, 3, '2023-01-20', 'oleg'), (5, 3, 4, '2024-03-14', 'kim'), (6, 4, 5, '2023-08-08', 'raj'),
  (7, 4, 5, '2024-01-02', 'oleg'), (8, 5, 2, '2023-04-17', 'kim'), (9, 6, 4, '2022-07-22', 'nina'),
  (10, 7, 5, '2023-09-09', 'kim'), (11, 7, 3, '2023-12-12', 'nina'), (12, 8, 4, '2024-02-29', 'raj'),
  (13, 2, 4, '2024-05-05', 'nina'), (14, 5, 3, '2023-10-31', 'oleg');
