(function () {
  var details = document.getElementById('details');
  var pinned = null;
  var WORDS = {'not-run': 'not run', 'diagonal': 'same library twice: not a pair'};
  // A cell of a large panel carries no tooltip: its pair comes from the headers, its
  // outcome from its class ("<outcome> <status>").
  function describe(cell) {
    var table = cell.closest('table');
    var first = cell.parentNode.cells[0].title;
    var second = table.tHead.rows[0].cells[cell.cellIndex].title;
    var mode = cell.closest('section').dataset.flags;
    var state = cell.classList[0], status = cell.classList[1] || state;  // "clean clean": one token
    return first + ' -> ' + second + ' @ ' + mode + '\n' +
      (WORDS[state] || 'outcome: ' + state + ' (' + status + ')');
  }
  function show(cell) { details.textContent = cell.title || describe(cell); }
  function light(cell, on) {
    var table = cell.closest('table');
    var col = table.tHead.rows[0].cells[cell.cellIndex];
    if (col && col.classList.contains('col')) { col.classList.toggle('hl', on); }
  }
  function pin(cell) {
    pinned = pinned === cell ? null : cell;
    details.classList.toggle('pinned', pinned !== null);
    show(cell);
  }
  document.querySelectorAll('table.matrix td[data-outcome]').forEach(function (cell) {
    cell.addEventListener('mouseenter', function () {
      light(cell, true);
      if (!pinned) { show(cell); }
    });
    cell.addEventListener('mouseleave', function () { light(cell, false); });
    cell.addEventListener('click', function () { pin(cell); });
  });
  // The bare cells of a large panel: one listener per table, not one per cell.
  document.querySelectorAll('table.matrix.compact').forEach(function (table) {
    function bare(event) {
      var cell = event.target.closest('td');
      return cell && !cell.dataset.outcome ? cell : null;
    }
    table.addEventListener('mouseover', function (event) {
      var cell = bare(event);
      if (cell) { light(cell, true); if (!pinned) { show(cell); } }
    });
    table.addEventListener('mouseout', function (event) {
      var cell = bare(event);
      if (cell) { light(cell, false); }
    });
    table.addEventListener('click', function (event) {
      var cell = bare(event);
      if (cell) { pin(cell); }
    });
  });
  document.querySelectorAll('.legend [data-count-for]').forEach(function (span) {
    var n = document.querySelectorAll('table.matrix td.' + span.dataset.countFor).length;
    span.textContent = '(' + n + ')';
  });
  document.body.dataset.ready = 'yes';
})();
